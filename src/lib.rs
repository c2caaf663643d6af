//! DataHelix: the input data plane for synchronous data-parallel training of multimodal models.
//!
//! (Crate docs are written in full once the modules below exist; see README.md.)

pub mod cli;
pub mod decode;
pub mod descriptor;
pub mod gen;
pub mod index;
pub mod manifest;
pub mod probe;
pub mod sampler;
