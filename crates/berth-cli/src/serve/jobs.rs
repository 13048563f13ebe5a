//! Exec output over server-sent events: `POST /v1/sandboxes/{id}/execs` starts a command and
//! answers at once with a job id; `GET /v1/sandboxes/{id}/execs/{job}/events` streams its
//! output as it arrives (`stdout` / `stderr` events, the bytes base64-encoded so binary output
//! survives), then one `exit` event with the command's status. Event ids count from 1, so a
//! client that reconnects with `Last-Event-ID: N` gets exactly what followed N.
//!
//! The output is kept in the server's memory (at most [`MAX_KEPT`] per job and
//! [`MAX_KEPT_ALL`] across the server, each chunk counted with its bookkeeping; what is over is
//! dropped and the `exit` event says how much) for [`RETAIN`] after the command ends. It is
//! live data, not durable: after a server restart a job answers 404, and a command whose server
//! died was ended with it (the exec's reaper kills it when its caller goes away).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use berth_contract::{ExecSummary, OutputSink, Stream};
use serde_json::{json, Value};
use tokio::sync::watch;

use super::auth::Scope;
use super::resources::ExecBody;
use super::routes::{authorize, failure};
use super::Server;
use crate::output::SCHEMA;

/// Output kept per job.
const MAX_KEPT: usize = 16 << 20;
/// Output kept across every job of this server.
const MAX_KEPT_ALL: usize = 1 << 30;
/// What one output chunk costs beyond its bytes (the item and its allocation), counted against
/// both limits: the sandbox decides how its output is cut, and a command writing one byte at a
/// time made a job hold 560 MB for its 16 MiB of output.
const CHUNK_OVERHEAD: usize = 64;
/// How long a finished job's output stays readable.
const RETAIN: Duration = Duration::from_secs(600);
/// Jobs kept at once (running or retained), across owners.
const MAX_JOBS: usize = 256;

/// One event of a job.
#[derive(Debug, Clone)]
enum Item {
    Output(Stream, Vec<u8>),
    Exit(Value),
}

#[derive(Debug, Default)]
struct Log {
    items: Vec<Item>,
    /// What the kept output costs (bytes and bookkeeping), also held in the server's total.
    kept: usize,
    dropped: u64,
    finished: Option<Instant>,
}

/// A started exec.
#[derive(Debug)]
pub(crate) struct Job {
    owner: String,
    sandbox: String,
    log: Mutex<Log>,
    /// Bumped on every new item (and at the end), waking streams.
    changed: watch::Sender<usize>,
    /// What every job of the server keeps ([`Jobs::held`]).
    held: Arc<AtomicUsize>,
}

impl Job {
    fn push(&self, item: Item) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        match &item {
            Item::Output(_, bytes) => {
                let cost = bytes.len() + CHUNK_OVERHEAD;
                let fits = log.kept + cost <= MAX_KEPT
                    && self
                        .held
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                            (held + cost <= MAX_KEPT_ALL).then_some(held + cost)
                        })
                        .is_ok();
                if !fits {
                    log.dropped += bytes.len() as u64;
                    return;
                }
                log.kept += cost;
            }
            Item::Exit(_) => log.finished = Some(Instant::now()),
        }
        log.items.push(item);
        let count = log.items.len();
        drop(log);
        self.changed.send_replace(count);
    }
}

impl Drop for Job {
    /// A job forgotten (retention over, no stream left reading it) gives its share back.
    fn drop(&mut self) {
        let kept = self.log.get_mut().unwrap_or_else(|p| p.into_inner()).kept;
        self.held.fetch_sub(kept, Ordering::AcqRel);
    }
}

/// Every job of this server, and what their output holds in memory altogether.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    held: Arc<AtomicUsize>,
}

impl Jobs {
    fn insert(&self, id: String, job: Arc<Job>) -> bool {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.retain(|_, job| {
            let log = job.log.lock().unwrap_or_else(|p| p.into_inner());
            log.finished.is_none_or(|at| at.elapsed() < RETAIN)
        });
        if jobs.len() >= MAX_JOBS {
            return false;
        }
        jobs.insert(id, job);
        true
    }

    fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }
}

struct Sink(Arc<Job>);

impl OutputSink for Sink {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        self.0.push(Item::Output(stream, bytes.to_vec()));
    }
}

fn job_id() -> String {
    let mut buf = [0u8; 10];
    // A failure here leaves zeros; ids are also scoped by owner and sandbox.
    let _ = getrandom::fill(&mut buf);
    format!("ej-{}", hex::encode(buf))
}

/// Start a command; its output follows on the job's event stream (scope `exec`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/execs", tag = "sandboxes", request_body = ExecBody,
    security(("bearer" = [])), params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 202, description = "`exec start` document: `job`, `events` (the SSE route)", body = super::routes::Document),
              (status = 404, body = super::routes::ErrorBody), (status = 503, body = super::routes::ErrorBody),
              (status = 403, description = "a sandbox that isolates nothing, on a server without \
                  `--allow-unisolated` (or a token without scope exec)", body = super::routes::ErrorBody)))]
pub(crate) async fn start(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<ExecBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = super::resources::checked_exec_body("exec start", body);
    let target = Some(id.clone());
    super::routes::call(
        &server,
        &headers,
        Method::POST,
        "/v1/sandboxes/{id}/execs",
        "exec start",
        Scope::Exec,
        target,
    )
    .run_with(body, |app, body| {
        let server = server.clone();
        async move {
            let spec = super::resources::command_spec(body);
            let request = crate::commands::exec::request(&app, &spec)?;
            let (row, provider, native) = app.sandbox(&id).await?;
            server.require_isolated(&app, &row.provider)?;
            let job = Arc::new(Job {
                owner: app.ledger.owner().to_owned(),
                sandbox: id.clone(),
                log: Mutex::new(Log::default()),
                changed: watch::channel(0).0,
                held: server.jobs.held.clone(),
            });
            let job_id = job_id();
            if !server.jobs.insert(job_id.clone(), job.clone()) {
                return Err(crate::errors::CliError {
                    kind: "capacity",
                    exit_code: crate::errors::code::UNAVAILABLE,
                    message: format!("{MAX_JOBS} execs are already kept by this server"),
                    hint: Some("retry when some have finished".into()),
                }
                .into());
            }
            tokio::spawn(async move {
                let outcome = match provider.streaming() {
                    Some(streaming) => {
                        let mut sink = Sink(job.clone());
                        streaming.exec_streaming(&native, &request, &mut sink).await
                    }
                    None => provider.exec(&native, &request).await.map(|out| {
                        job.push(Item::Output(Stream::Stdout, out.stdout.clone()));
                        if let Some(stderr) = &out.stderr {
                            job.push(Item::Output(Stream::Stderr, stderr.clone()));
                        }
                        ExecSummary {
                            status: out.status.clone(),
                            stdout_total: out.stdout_total,
                            stderr_total: out.stderr_total,
                            duration: out.duration,
                        }
                    }),
                };
                let dropped = job.log.lock().unwrap_or_else(|p| p.into_inner()).dropped;
                let exit = match outcome {
                    Ok(summary) => json!({
                        "status": summary.status,
                        "exit_code": summary.status.shell_code(),
                        "stdout_bytes": summary.stdout_total,
                        "stderr_bytes": summary.stderr_total,
                        "dropped_bytes": dropped,
                        "duration_ms": summary.duration.as_secs_f64() * 1000.0,
                    }),
                    Err(err) => {
                        let failed = crate::errors::classify(&anyhow::Error::new(err));
                        json!({ "error": failed, "dropped_bytes": dropped })
                    }
                };
                job.push(Item::Exit(exit));
            });
            crate::output::emit(
                "exec start",
                json!({
                    "sandbox": id,
                    "job": job_id,
                    "events": format!("/v1/sandboxes/{id}/execs/{job_id}/events"),
                }),
            );
            Ok(crate::errors::code::OK)
        }
    })
    .await
    .into_response()
    .map_status(StatusCode::ACCEPTED)
}

trait MapStatus {
    fn map_status(self, accepted: StatusCode) -> Response;
}

impl MapStatus for Response {
    /// A started job answers 202 rather than 200.
    fn map_status(mut self, accepted: StatusCode) -> Response {
        if self.status() == StatusCode::OK {
            *self.status_mut() = accepted;
        }
        self
    }
}

/// A job's output and exit, live; resumable with `Last-Event-ID`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/execs/{job}/events", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("job" = String, Path, description = "Job id (`ej-…`)")),
    responses((status = 200, description = "`text/event-stream`: `stdout` / `stderr` events (data: base64 bytes), then one `exit` event (data: JSON status); ids count from 1; an `error` event ends it when its token is revoked"),
              (status = 404, body = super::routes::ErrorBody)))]
pub(crate) async fn events(
    State(server): State<Arc<Server>>,
    Path((id, job_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let token = match authorize(&server, &headers, Scope::Read, "exec events").await {
        Ok(token) => token,
        Err(response) => return response,
    };
    let job = match server.jobs.get(&job_id) {
        Some(job) if job.owner == token.owner && job.sandbox == id => job,
        // Another owner's job is indistinguishable from none.
        _ => {
            return failure(
                StatusCode::NOT_FOUND,
                "exec events",
                "not_found",
                format!("no exec job `{job_id}` in `{id}` for this token's owner"),
                Some("jobs are kept in the server's memory for 10 minutes after they end"),
            )
        }
    };
    let after = match super::events::resume_point(&headers, None, "exec events") {
        Ok(after) => usize::try_from(after).unwrap_or(usize::MAX),
        Err(response) => return response,
    };
    let changed = job.changed.subscribe();
    let stream = futures_util::stream::unfold(
        (job, changed, after, false),
        |(job, mut changed, mut next, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let (batch, finished): (Vec<(usize, Item)>, bool) = {
                    let log = job.log.lock().unwrap_or_else(|p| p.into_inner());
                    let batch = log
                        .items
                        .iter()
                        .enumerate()
                        .skip(next)
                        .map(|(i, item)| (i + 1, item.clone()))
                        .collect();
                    (batch, log.finished.is_some())
                };
                // Resumed after the exit event: nothing more will come.
                if batch.is_empty() && finished {
                    return None;
                }
                if !batch.is_empty() {
                    next = batch.last().map(|(n, _)| *n).unwrap_or(next);
                    let over = batch.iter().any(|(_, item)| matches!(item, Item::Exit(_)));
                    let events: Vec<Result<Event, Infallible>> = batch
                        .into_iter()
                        .map(|(n, item)| {
                            let event = Event::default().id(n.to_string());
                            Ok(match item {
                                Item::Output(stream, bytes) => event
                                    .event(match stream {
                                        Stream::Stdout => "stdout",
                                        Stream::Stderr => "stderr",
                                    })
                                    .data(base64::engine::general_purpose::STANDARD.encode(bytes)),
                                Item::Exit(exit) => event
                                    .event("exit")
                                    .data(json!({ "schema": SCHEMA, "exit": exit }).to_string()),
                            })
                        })
                        .collect();
                    return Some((
                        futures_util::stream::iter(events),
                        (job, changed, next, over),
                    ));
                }
                if changed.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    use futures_util::StreamExt;
    Sse::new(super::events::until_revoked(
        server,
        &headers,
        stream.flatten(),
    ))
    .keep_alive(KeepAlive::default())
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(jobs: &Jobs) -> Job {
        Job {
            owner: "o".into(),
            sandbox: "bx-1".into(),
            log: Mutex::new(Log::default()),
            changed: watch::channel(0).0,
            held: jobs.held.clone(),
        }
    }

    /// The sandbox cuts its output: one byte per chunk is counted with its bookkeeping, so a
    /// job holds about its limit in memory however the output comes, and the server's total
    /// is bounded across jobs and given back when a job is forgotten.
    #[test]
    fn what_a_job_keeps_is_bounded_however_its_output_is_cut() {
        let jobs = Jobs::default();
        let one = job(&jobs);
        let chunks = MAX_KEPT; // one byte each: 16 Mi chunks offered
        for _ in 0..chunks {
            one.push(Item::Output(Stream::Stdout, vec![b'x']));
        }
        let log = one.log.lock().unwrap();
        let kept_chunks = log.items.len();
        assert_eq!(kept_chunks, MAX_KEPT / (1 + CHUNK_OVERHEAD), "{}", log.kept);
        assert_eq!(log.dropped, (chunks - kept_chunks) as u64);
        assert_eq!(jobs.held.load(Ordering::Acquire), log.kept);
        drop(log);
        // Near the server's limit, another job's output is dropped and counted.
        jobs.held
            .fetch_add(MAX_KEPT_ALL - MAX_KEPT, Ordering::AcqRel);
        let two = job(&jobs);
        two.push(Item::Output(Stream::Stderr, vec![0; 1 << 20]));
        let log = two.log.lock().unwrap();
        assert!(log.items.is_empty());
        assert_eq!(log.dropped, 1 << 20);
        drop(log);
        jobs.held
            .fetch_sub(MAX_KEPT_ALL - MAX_KEPT, Ordering::AcqRel);
        drop(one);
        assert_eq!(
            jobs.held.load(Ordering::Acquire),
            0,
            "a forgotten job gives its share back"
        );
        two.push(Item::Output(Stream::Stderr, vec![0; 1 << 20]));
        assert_eq!(two.log.lock().unwrap().items.len(), 1);
    }
}
