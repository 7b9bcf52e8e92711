//! The service's migrations, `migrations/<backend>/`, and the checksums they are held to.
//!
//! sqlx records each applied migration's checksum and refuses to start when a migration's text
//! no longer matches it: migrations are append-only. Three versions changed their text once,
//! when the example shop's tables left the service's set for the example's own
//! (`crates/idemgate-shop/migrations/`): 2 (the shop's tables) and 8 (an index on its ledger) do nothing now,
//! and 4 keeps only the service's index. Their first texts are kept, verbatim, in
//! `migrations/<backend>/first/`, and each of these versions records its first text's checksum,
//! as every database that ran that text did. So a database that ran the first texts validates
//! and keeps its shop tables, and a new one gets only the service's tables.

use std::borrow::Cow;
use std::sync::LazyLock;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

use super::Backend;

/// The first text of each version whose text changed, per backend.
const FIRST_TEXTS: [(Backend, [(i64, &str); 3]); 3] = [
    (
        Backend::Postgres,
        [
            (2, include_str!("../../migrations/postgres/first/0002_shop_example.sql")),
            (4, include_str!("../../migrations/postgres/first/0004_trace_indexes.sql")),
            (8, include_str!("../../migrations/postgres/first/0008_reconcile_window_indexes.sql")),
        ],
    ),
    (
        Backend::MySql,
        [
            (2, include_str!("../../migrations/mysql/first/0002_shop_example.sql")),
            (4, include_str!("../../migrations/mysql/first/0004_trace_indexes.sql")),
            (8, include_str!("../../migrations/mysql/first/0008_reconcile_window_indexes.sql")),
        ],
    ),
    (
        Backend::Sqlite,
        [
            (2, include_str!("../../migrations/sqlite/first/0002_shop_example.sql")),
            (4, include_str!("../../migrations/sqlite/first/0004_trace_indexes.sql")),
            (8, include_str!("../../migrations/sqlite/first/0008_reconcile_window_indexes.sql")),
        ],
    ),
];

/// `migrations`, each version of `first_texts` recording its first text's checksum.
fn held_to_first_texts(mut migrator: Migrator, first_texts: &[(i64, &'static str)]) -> Migrator {
    for migration in migrator.migrations.to_mut() {
        if let Some((_, text)) = first_texts.iter().find(|(v, _)| *v == migration.version) {
            migration.checksum = checksum_of(migration.version, text);
        }
    }
    migrator
}

/// sqlx's checksum of a migration's text.
fn checksum_of(version: i64, text: &'static str) -> Cow<'static, [u8]> {
    Migration::new(version, Cow::Borrowed(""), MigrationType::Simple, text.into_sql_str(), false).checksum
}

fn first_texts(backend: Backend) -> &'static [(i64, &'static str)] {
    FIRST_TEXTS.iter().find(|(b, _)| *b == backend).map(|(_, texts)| texts.as_slice()).unwrap_or(&[])
}

static POSTGRES: LazyLock<Migrator> = LazyLock::new(|| {
    held_to_first_texts(sqlx::migrate!("migrations/postgres"), first_texts(Backend::Postgres))
});
static MYSQL: LazyLock<Migrator> =
    LazyLock::new(|| held_to_first_texts(sqlx::migrate!("migrations/mysql"), first_texts(Backend::MySql)));
static SQLITE: LazyLock<Migrator> =
    LazyLock::new(|| held_to_first_texts(sqlx::migrate!("migrations/sqlite"), first_texts(Backend::Sqlite)));

/// The service's migrations of `backend`.
pub(super) fn service(backend: Backend) -> &'static Migrator {
    match backend {
        Backend::Sqlite => &SQLITE,
        Backend::Postgres => &POSTGRES,
        Backend::MySql => &MYSQL,
    }
}

/// The service's migrations of `backend` as their first texts ran them: a database of the shape
/// before the example shop's tables left, for the tests of that upgrade.
pub fn as_first_run(backend: Backend) -> Migrator {
    let mut migrations = service(backend).migrations.to_vec();
    for migration in &mut migrations {
        if let Some((_, text)) = first_texts(backend).iter().find(|(v, _)| *v == migration.version) {
            migration.sql = text.into_sql_str();
        }
    }
    Migrator::with_migrations(migrations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_made_here_is_the_one_sqlx_records_for_an_unchanged_text() {
        let unchanged = include_str!("../../migrations/postgres/0001_dedup_and_delivery_log.sql");
        let recorded = sqlx::migrate!("migrations/postgres");
        let first = recorded.migrations.iter().find(|m| m.version == 1).expect("version 1");
        assert_eq!(checksum_of(1, unchanged), first.checksum);
    }

    #[test]
    fn only_the_changed_versions_record_their_first_texts_checksums() {
        for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
            let as_written = match backend {
                Backend::Postgres => sqlx::migrate!("migrations/postgres"),
                Backend::MySql => sqlx::migrate!("migrations/mysql"),
                Backend::Sqlite => sqlx::migrate!("migrations/sqlite"),
            };
            for (held, written) in service(backend).migrations.iter().zip(as_written.migrations.iter()) {
                assert_eq!(held.version, written.version);
                let changed = [2, 4, 8].contains(&held.version);
                assert_eq!(held.checksum != written.checksum, changed, "{backend} version {}", held.version);
            }
            let first = as_first_run(backend);
            let shop = first.migrations.iter().find(|m| m.version == 2).expect("version 2");
            assert!(shop.sql.as_str().contains("CREATE TABLE shop_order"), "{backend}");
        }
    }
}
