//! Which database a URL points at: the one fact every dialect choice hangs off, read from the
//! URL in one place ([`DatabaseUrl::read`]), with what else the URL alone tells (an in-memory
//! SQLite database). Nothing else looks inside a database URL.

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

/// What a database URL says before anything connects to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DatabaseUrl {
    /// The scheme's backend.
    pub(crate) backend: Backend,
    /// A SQLite database that lives in memory (`sqlite::memory:`, `mode=memory`): it exists once
    /// per pool, so a second pool on the same URL would open another, empty database.
    pub(crate) in_memory: bool,
}

impl DatabaseUrl {
    /// Reads `url`: its scheme's backend and whether it is an in-memory SQLite database.
    pub(crate) fn read(url: &str) -> Result<Self, UnknownScheme> {
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
        let backend = match scheme {
            "sqlite" => Backend::Sqlite,
            "postgres" | "postgresql" => Backend::Postgres,
            "mysql" | "mariadb" => Backend::MySql,
            _ => return Err(UnknownScheme(scheme.to_owned())),
        };
        let in_memory =
            backend == Backend::Sqlite && (url.contains(":memory:") || url.contains("mode=memory"));
        Ok(Self { backend, in_memory })
    }
}

impl Backend {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_its_backend_and_an_in_memory_sqlite_database_is_told_from_a_file() {
        let read = |url: &str| DatabaseUrl::read(url).unwrap();
        assert_eq!(
            read("sqlite://idemgate.db?mode=rwc"),
            DatabaseUrl { backend: Backend::Sqlite, in_memory: false }
        );
        assert_eq!(read("sqlite::memory:"), DatabaseUrl { backend: Backend::Sqlite, in_memory: true });
        assert_eq!(read("sqlite://:memory:"), DatabaseUrl { backend: Backend::Sqlite, in_memory: true });
        assert!(read("sqlite://shared?mode=memory&cache=shared").in_memory);
        assert_eq!(read("postgres://u@h/db"), DatabaseUrl { backend: Backend::Postgres, in_memory: false });
        assert_eq!(read("postgresql://u@h/db").backend, Backend::Postgres);
        assert_eq!(read("mysql://root@h/test").backend, Backend::MySql);
        assert_eq!(read("mariadb://root@h/test").backend, Backend::MySql);
        assert!(!read("mysql://root@h/memory?mode=memory").in_memory, "only SQLite lives in memory");
        let err = DatabaseUrl::read("oracle://x").unwrap_err().to_string();
        assert!(err.contains("\"oracle\" is not supported"), "{err}");
    }
}
