//! Which database a URL points at: the one fact every dialect choice hangs off.

use std::fmt;
use std::str::FromStr;

/// A database URL's scheme (or a backend's name) that is none of the supported ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("database URL scheme {0:?} is not supported: use sqlite://, postgres:// or mysql:// (MariaDB too)")]
pub struct UnknownScheme(pub String);

/// Which database a URL points at. The gate's dialect choices hang off this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl Backend {
    /// Reads the backend from a database URL's scheme.
    pub fn from_url(url: &str) -> Result<Self, UnknownScheme> {
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
        match scheme {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::MySql),
            _ => Err(UnknownScheme(scheme.to_owned())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
        }
    }

    /// The statement that opens a write transaction.
    ///
    /// SQLite takes its write lock up front (`BEGIN IMMEDIATE`): a deferred transaction that
    /// has read first cannot wait for the lock and fails with SQLITE_BUSY instead. The servers
    /// lock rows, so a plain BEGIN is right there.
    pub(crate) fn begin_statement(self) -> &'static str {
        match self {
            Self::Sqlite => "BEGIN IMMEDIATE",
            Self::Postgres | Self::MySql => "BEGIN",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = UnknownScheme;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" | "pg" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::MySql),
            _ => Err(UnknownScheme(s.to_owned())),
        }
    }
}
