//! What a setting answers when a value cannot be used: the key, as the file spells it, and
//! why. It is the one error of that shape: every settings section validates itself and answers
//! with it, and so do a route, a state machine's definition, a configured handler and the gate
//! when what they are given is refused; `config` only gathers the sections and loads them.
//! Beside it, the machine's name, which defaults derive from.

/// A setting (a section's key, a route's, a handler definition's part) that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration key {key}: {message}")]
pub struct Invalid {
    /// The key, as the configuration file spells it: `http.bind`, `routes[2].handler`; for a
    /// state machine defined in code, the part of its definition: `table`, `from[1]`.
    pub key: String,
    pub message: String,
}

/// An [`Invalid`] for `key`.
pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid { key: key.into(), message: message.into() }
}

/// This machine's name (in a container, its host name), for the defaults that name this
/// process: the instance id and the web UI's address. `localhost` when it cannot be read.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
