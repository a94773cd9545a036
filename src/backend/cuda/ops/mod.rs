//! One room per op family: its planner (a pure function from the op's
//! shape, the mode, the device's capabilities and the tuning table to the
//! kernel and its geometry), its launchers and its kernel sources; and the
//! kernel table of every family (`kernels.rs`), which `device/` compiles
//! and loads.

pub(crate) mod attention;
pub mod kernels;
