//! A business key's whole story: its dedup record (live or archived), its deliveries oldest
//! first a page at a time, a summary of all of them, and the business state its handler owns.
//!
//! A search names a bizId, a msgId, a UNIQ_KEY or a W3C trace id ([`SearchBy::Any`] tries them
//! in that order, the trace id only for text that is one: 32 hex digits). When the text matches
//! more than one key (the same bizId under two biz_types, two execute_times or two consumer
//! groups; the messages of one trace), the answer is the list of candidates to choose from.
//!
//! A key can have millions of deliveries (a message redelivered without end, a producer
//! resending in a loop), so no read here costs what the key's size does. The keys a bizId names
//! are stepped through, one probe of `delivery_log_key` each; the summary counts every
//! delivery, each outcome, duplicate cause and collision one range of
//! `delivery_log_key_outcome`, read up to [`COUNT_LIMIT`] (a count past it is a lower bound,
//! "more than"); the timeline is a page of [`PAGE_DELIVERIES`] read in the index's order from a
//! cursor, however deep the page. A msgId, UNIQ_KEY or trace id names its keys through its own
//! index, its first [`COUNT_LIMIT`] rows at most.
//!
//! What a search names is checked in `query`; `search` finds the keys it names and settles on
//! one, whose story `story` reads; both run the statements of `sql`, whose counts `tally` turns
//! into the summary. `answer` is what comes back, `links` the links out of it to other tools,
//! and `text` its plain form.

mod answer;
pub(crate) mod explain;
mod links;
mod query;
mod search;
mod sql;
mod story;
mod tally;
mod text;

pub use answer::{Answer, Candidate, ClaimRecord, FinalState, Story, Summary, TraceRef};
pub use links::{MSG_ID_PLACEHOLDER, TRACE_ID_PLACEHOLDER, fill_link, message_trace_link, trace_link};
pub use query::{KeyRef, PageAt, SearchBy, TraceQuery};
pub use search::trace;
pub use sql::{PAGE_DELIVERIES, statements, statements_by_trace_id};
pub use story::TraceContext;
pub(crate) use story::claims;
pub use tally::COUNT_LIMIT;
pub(crate) use tally::count_text;
pub use text::render_text;
