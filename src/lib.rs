//! DataHelix: the input data plane for synchronous data-parallel training of multimodal models.
//!
//! (Crate docs are written in full once the modules below exist; see README.md.)

pub mod cli;
pub mod collective;
pub mod comm;
pub mod decode;
pub mod descriptor;
