//! The clauses. Each returns an [`Outcome`]; `check!` turns a false condition into a failure
//! with its message. Every clause destroys the sandboxes it made, whatever happened.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use berth_contract::{
    CanonicalState, Capability, DestroyOutcome, ErrorKind, ExecRequest, ExitStatus, LabelFilter,
    NativeId, Observation, OutputSink, ProcessStatus, ProviderError, ProviderExt, Stream,
    Transition,
};

use crate::Subject;

/// A clause's verdict before grading.
pub(crate) enum Outcome {
    Pass(Vec<String>),
    Fail(String),
    Unverified(String),
}

type Body = for<'a> fn(&'a Subject) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// One clause.
#[derive(Debug)]
pub struct Clause {
    /// Stable id.
    pub id: &'static str,
    /// The capability it proves; `None` for the required core.
    pub capability: Option<Capability>,
    pub(crate) run: Body,
}

macro_rules! clause {
    ($id:literal, $cap:expr, $body:ident) => {
        Clause {
            id: $id,
            capability: $cap,
            run: |s| Box::pin($body(s)),
        }
    };
}

/// Every clause, in run order.
pub static CLAUSES: &[Clause] = &[
    clause!("core.create_ready_exec", None, create_ready_exec),
    clause!(
        "core.exec_quoting_pipes_home",
        None,
        exec_quoting_pipes_home
    ),
    clause!("core.exec_timeout_kills", None, exec_timeout_kills),
    clause!(
        "core.destroy_twice_verified_gone",
        None,
        destroy_twice_verified_gone
    ),
    clause!("core.secret_canary_absent", None, secret_canary_absent),
    clause!("isolation.default_walls", None, default_walls),
    clause!(
        "exec_streaming.chunks",
        Some(Capability::ExecStreaming),
        streaming_chunks
    ),
    clause!(
        "loopback_forward.round_trip_only",
        Some(Capability::LoopbackForward),
        loopback_forward
    ),
    clause!(
        "access.terminal_and_ports",
        Some(Capability::Access),
        access
    ),
    clause!(
        "exec_detached.spawn_status_kill",
        Some(Capability::ExecDetached),
        detached
    ),
    clause!(
        "files.round_trip_binary",
        Some(Capability::Files),
        files_round_trip
    ),
    clause!("files.hostile_path", Some(Capability::Files), files_hostile),
    clause!(
        "stop_start.round_trip_settles",
        Some(Capability::StopStart),
        stop_start
    ),
    clause!(
        "suspend_resume.round_trip_settles",
        Some(Capability::SuspendResume),
        suspend_resume
    ),
    clause!(
        "filesystem_snapshot.restore_delete",
        Some(Capability::FilesystemSnapshot),
        snapshot
    ),
    clause!("fork.independent_copy", Some(Capability::Fork), fork),
    clause!(
        "listing.visibility_after_destroy",
        Some(Capability::Listing),
        listing_visibility
    ),
    clause!(
        "listing.must_not_fire_foreign",
        Some(Capability::Listing),
        listing_foreign
    ),
    clause!("teardown.must_fire_on_error", None, must_fire_on_error),
    clause!("teardown.must_fire_on_panic", None, must_fire_on_panic),
    clause!("ttl.fires_when_due", Some(Capability::Ttl), ttl_unexercised),
    clause!(
        "ttl.not_during_exec",
        Some(Capability::Ttl),
        ttl_unexercised
    ),
    clause!("unsupported.answers_unsupported", None, unsupported_paths),
];

macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

type Step<T> = Result<T, String>;

fn fail(context: &str, err: ProviderError) -> String {
    format!("{context}: {err}")
}

async fn create(s: &Subject, owner: &str) -> Step<NativeId> {
    s.provider
        .create(&s.request_for(owner))
        .await
        .map(|c| c.native_id)
        .map_err(|e| fail("create", e))
}

async fn discard(s: &Subject, ids: &[&NativeId]) {
    for id in ids {
        let _ = s.provider.destroy(id).await;
    }
}

async fn sh(s: &Subject, id: &NativeId, line: &str) -> Step<berth_contract::ExecOutput> {
    s.provider
        .exec(id, &ExecRequest::shell(line))
        .await
        .map_err(|e| fail(&format!("exec `{line}`"), e))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn verdict(step: Step<Vec<String>>) -> Outcome {
    match step {
        Ok(notes) => Outcome::Pass(notes),
        Err(why) => Outcome::Fail(why),
    }
}

/// Runs `body` on a fresh sandbox and destroys it afterwards.
async fn on_sandbox<'a, F, Fut>(s: &'a Subject, body: F) -> Outcome
where
    F: FnOnce(NativeId) -> Fut,
    Fut: Future<Output = Step<Vec<String>>> + 'a,
{
    let id = match create(s, &s.owner).await {
        Ok(id) => id,
        Err(why) => return Outcome::Fail(why),
    };
    let result = body(id.clone()).await;
    discard(s, &[&id]).await;
    verdict(result)
}

mod access;
mod files;
mod groups;
mod lifecycle;
mod teardown;
mod walls;

use access::*;
use files::*;
use groups::*;
use lifecycle::*;
use teardown::*;
use walls::*;
