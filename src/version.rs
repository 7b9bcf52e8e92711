//! The service's version, one for the workspace.

/// The service's version: the `version` label of `idemgate_build_info`, and what
/// `idemgate --version` prints.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
