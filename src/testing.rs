//! The crate's inside as its own integration tests reach it: each module below re-exports,
//! under the module's own name, exactly the items `tests/` uses, and nothing else.
//!
//! This is not the library's API (that is what the crate root exports) and it promises
//! nothing: it exists so that the rest of the crate can stay `pub(crate)` while the suites
//! under `tests/` still drive the gate, the stores and the jobs directly. It is built only
//! with the `tools` feature, beside the command line and the benchmarks.

pub mod app {
    pub use crate::app::{Application, Feed, Running, assemble_gate};
}
pub mod archive {
    pub use crate::archive::{
        ArchiveOptions, ArchiveOutcome, ArchiveScheduler, Fault, RunKind, RunStatus, StartedBy, archive_once,
        dry_run,
    };
    pub mod manual {
        pub use crate::archive::manual::render_dry_run;
    }
    pub mod retention {
        pub use crate::archive::retention::DAY_MS;
    }
    pub mod runs {
        pub use crate::archive::runs::{RunRecord, last_success, recent};
    }
}
pub mod bench {
    pub mod reconcile {
        pub use crate::bench::reconcile::{GROUP, load};
    }
}
pub mod broker {
    pub use crate::broker::Producer;
    pub mod lag {
        pub use crate::broker::lag::{LagProbe, ReadResult, TopicLag};
    }
    pub mod local {
        pub use crate::broker::local::{LocalBroker, LocalCluster};
    }
}
pub mod clock {
    pub use crate::clock::{format_ms, now_ms};
}
pub mod config {
    pub use crate::config::Settings;
}
pub mod cron {
    pub use crate::cron::Schedule;
}
pub mod delivery {
    pub use crate::delivery::{Delivery, REPLAY_PROPERTY};
}
pub mod delivery_log {
    pub use crate::delivery_log::{AttemptId, Entry, MAX_KEPT_PAYLOAD, append_once};
}
pub mod gate {
    pub use crate::gate::{ClaimPath, Disposition, Gate, GroupSettings, Identity, Policy};
}
pub mod handler {
    pub use crate::handler::{Answers, Effect, Fact, Handler, HandlerError, Handlers, Work, handle_each};
}
pub mod http {
    pub use crate::http::Web;
}
pub mod inspect {
    pub use crate::inspect::{Limits, READ_BOUNDS};
    pub mod lists {
        pub use crate::inspect::lists::{ListKind, ListQuery, list, statement};
    }
    pub mod overview {
        pub use crate::inspect::overview::{LATEST, statements};
    }
    pub mod trace {
        pub use crate::inspect::trace::{
            Answer, COUNT_LIMIT, FinalState, KeyRef, PAGE_DELIVERIES, SearchBy, Story, TraceContext,
            TraceQuery, render_text, statements, trace,
        };
    }
}
pub mod layout {
    pub use crate::layout::{Layout, LayoutError, current, ensure, shard_of};
}
pub mod metrics {
    pub use crate::metrics::{BuildInfo, HttpTimeout, Metrics};
}
pub mod outcome {
    pub use crate::outcome::{DuplicateCause, Layer, Outcome, Verdict};
}
pub mod prefilter {
    pub use crate::prefilter::{Check, FallbackCause, Prefilter, RedisSettings, Settle, Settled, Step};
}
pub mod produce {
    pub use crate::produce::ProduceReport;
}
pub mod reconcile {
    pub use crate::reconcile::{
        AnomalyKind, ReconcileOptions, ReconcileReport, ReconcileScheduler, ReconcileSettings,
        reconcile_once, statements,
    };
    pub mod runs {
        pub use crate::reconcile::runs::{anomalies, counts, get, recent};
    }
}
pub mod replay {
    pub use crate::replay::{Action, Line, Publish, Selection, replay, replay_to};
}
pub mod route {
    pub use crate::route::{BizKey, RouteConfig, Routes};
}
pub mod scratch {
    pub use crate::scratch::{SERVICE_TABLES, ScratchDb};
    pub mod galera {
        pub use crate::scratch::galera::{LocalGalera, NODES, StateTransfer};
    }
}
pub mod shop {
    pub use crate::shop::{
        CONSUMER_GROUP, ConfirmPayment, CreateOrder, DeductStock, INITIAL_STOCK, ORDER_CREATE,
        PAYMENT_CONFIRM, STOCK_DEDUCT, STOCK_LEDGER_CHECK, TAG_ORDER_CREATE, TAG_PAYMENT_CONFIRM,
        TAG_STOCK_DEDUCT, TOPIC, configure, handlers, migrate, order_message, payment_message, prepare,
        routes, seed_stock, settings,
    };
}
pub mod sql_handler {
    pub use crate::sql_handler::{CheckConfig, Expect, OnZero, SqlHandlerConfig, StatementConfig};
}
pub mod state_machine {
    pub use crate::state_machine::{
        Answer, Compare, Found, Move, OnMissing, StateMachine, StateMachineConfig, TransitionSpec, Value,
        handlers,
    };
}
pub mod store {
    pub use crate::store::{
        Backend, Conn, MySqlFlavour, Sql, Store, StoreOptions, query, query_built, values_list,
    };
    pub mod galera {
        pub use crate::store::galera::{IdSettings, id_settings};
    }
    pub mod plan {
        pub use crate::store::plan::reads;
    }
    pub mod migrations {
        pub use crate::store::migrations::as_first_run;
    }
}
