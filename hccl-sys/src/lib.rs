//! Raw bindings to Huawei's HCCL collective library and the ACL runtime.
//!
//! This crate is the bottom of DataHelix's three layers at the Ascend edge
//! (`hccl-sys` → `datahelix::comm::hccl` → the `Collective` trait), in the manner of
//! `zstd-sys` / `zstd-safe` / `zstd`.
//!
//! **Status: an empty shell.** The declarations, the `links = "hccl"` build probe of a CANN
//! install (`ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME`, the default roots) and the host-memory
//! emulator in `csrc/hccl-emu/` arrive with the HCCL backend. Until then nothing here links
//! against anything, so building DataHelix never needs CANN.
//!
//! The API facts the declarations will follow are collected in the project's
//! `shared/reference/hccl-api.md`.
#![no_std]
