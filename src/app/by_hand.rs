//! The service as a command run by hand meets it (`idemgate trace`, `reconcile`, `archive`,
//! `replay`, `migrate`): the migrated store, the routes, the handlers and what the trace page
//! reads a story with, assembled from the settings by the same functions as
//! [`Application::build_with`](super::Application::build_with) assembles them for `serve`, and
//! nothing that runs: no gate pool, HTTP server, consumer or schedule.
//!
//! This module wires; it must not run a command (the command line does).

use crate::config::Settings;
use crate::gate::Identity;
use crate::handler::Handlers;
use crate::inspect::trace::TraceContext;
use crate::reconcile::Check;
use crate::route::Routes;
use crate::store::Store;

/// The store, routes and handlers of the service `settings` describe, for one command.
pub struct ByHand {
    settings: Settings,
    store: Store,
    routes: Routes,
    handlers: Handlers,
}

impl ByHand {
    /// Opens (and migrates) the database the settings name, with the configured handlers
    /// beside `own`, a program's own.
    pub async fn open(settings: &Settings, own: Handlers) -> anyhow::Result<Self> {
        let handlers = settings.handlers_with(own)?;
        let store = super::open_store(settings).await?;
        Ok(Self { settings: settings.clone(), routes: settings.routes(), store, handlers })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The group and instance the command acts as.
    pub fn identity(&self) -> Identity {
        self.settings.identity()
    }

    /// What a key's story is read with: the pages' query bound, the log's retention, the
    /// Grafana link, the trace links and the business state each handler describes, as the
    /// trace page has them.
    pub fn trace_context(&self) -> TraceContext {
        crate::http::trace_context(
            &self.settings.http,
            &self.settings.archive,
            self.handlers.by_biz_type(&self.routes),
        )
    }

    /// The handlers' invariant checks, as the reconcile schedule runs them.
    pub fn checks(&self) -> Vec<Check> {
        self.handlers.checks(&self.routes)
    }

    /// Closes the store's pool.
    pub async fn close(self) {
        self.store.close().await;
    }
}
