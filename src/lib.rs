//! DataHelix: the input data plane for synchronous data-parallel training of multimodal models
//! (video, image, text).
//!
//! In synchronous training the slowest rank sets the pace, and multimodal samples differ by orders
//! of magnitude in decode cost and in accelerator compute. DataHelix plans both while samples are
//! still small [descriptors](descriptor): it balances accelerator work across ranks, places decode
//! work against each rank's deadline, and moves decoded tensors between ranks only when that pays.
//! Every rank runs the same deterministic planner on the same all-gathered inputs; there is no
//! central server. See `DESIGN.md` in the project's shared folder for the architecture.
//!
//! # Example: index a dataset and walk the protocol's global batches
//!
//! ```no_run
//! use datahelix::index::{build, BuildOptions, Index};
//! use datahelix::sampler::{rank_local_split, Sampler};
//!
//! let dir = std::path::Path::new("data/tiny");
//! build(dir, &BuildOptions::default())?; // probes headers only; re-probes only what changed
//! let index = Index::open(dir)?;
//! let ids: Vec<u64> = index.iter().filter_map(Result::ok).map(|d| d.id).collect();
//! let sampler = Sampler::new(&ids, 42);
//! let batch = sampler.global_batch(0, 8);
//! for id in rank_local_split(&batch, 0, 2) {
//!     let d = index.get(index.position_of(id).unwrap())?;
//!     println!("{id}: {} {}x{} {:.1}s {}", d.codec, d.width, d.height, d.duration_s(), d.status);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What works, what is gated, what is not yet
//!
//! | piece | module | state |
//! |---|---|---|
//! | manifest, descriptors, header-only probe | [`manifest`], [`descriptor`], [`probe`] | works |
//! | memory-mapped descriptor index | [`index`] | works |
//! | WebDataset shards (tar, zip), read in place | [`shard`] | works: local folders and brace patterns; deflated zip members inflated in memory; not `.tar.gz` |
//! | the protocol's sampler | [`sampler`] | works |
//! | dataset generator (`datahelix gen`) | [`gen`] | works (drives the `ffmpeg` CLI) |
//! | sampled-frame decoder, worker pool, decode-cost model | [`decode`] | works |
//! | one sample decoded in pieces on several ranks (split at keyframes, [`decode::split`]) | [`decode`] | works: placement offers late samples in pieces, the owner puts them together |
//! | `Collective` trait, MPI backend with watchdog, transfer model | [`collective`], [`comm`] | works |
//! | HCCL backend | [`comm`] (feature `hccl`), crate `hccl-sys` | against the project's emulator; no Ascend hardware tested |
//! | accelerator cost model, planner (batching, placement, gated rebalance) | [`cost`], [`plan`] | works |
//! | one rank's step protocol, sans I/O (fixed collective schedule) | [`step`] | works; the loader and the simulator both run it |
//! | policies, executor ([`exec::loader::Loader`]), emulated accelerator | [`policy`], [`exec`], [`emu`] | works, host memory (MPI) only |
//! | metrics, traces, plots, comparison | [`metrics`] | works |
//! | C ABI (`datahelix.h`) | [`ffi`] | works; a caller-provided communicator is not yet supported |
//! | discrete-event simulator (one step engine per rank) | [`sim`] | works; validated against real runs (`scripts/workloads/README.md`) |

pub mod cli;
pub mod collective;
pub mod comm;
pub mod cost;
pub mod decode;
pub mod descriptor;
pub mod emu;
pub mod exec;
pub mod ffi;
pub mod gen;
pub mod index;
pub mod manifest;
pub mod metrics;
pub mod plan;
pub mod policy;
pub mod probe;
pub mod rng;
pub mod sampler;
pub mod shard;
pub mod sim;
pub mod step;
pub mod text;
