//! What a settings section answers when a value cannot be used: the key, as the file spells
//! it, and why. Every section validates itself and answers with this; `config` only gathers
//! the sections and loads them.

/// A setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration key {key}: {message}")]
pub struct Invalid {
    /// The key, as the configuration file spells it: `http.bind`, `routes[2].handler`.
    pub key: String,
    pub message: String,
}

/// An [`Invalid`] for `key`.
pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid { key: key.into(), message: message.into() }
}
