//! A mission's event log as server-sent events: each event's id is its sequence number, so a
//! client that reconnects with `Last-Event-ID: N` (or `?after=N`) gets exactly the events after
//! N — the log is durable, so nothing is lost across a reconnect or a server restart. The
//! stream ends after the mission's final event.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use berth_store::MissionStore;
use serde::Deserialize;

use super::auth::Scope;
use super::routes::{authorize, failure, owned_mission};
use super::Server;

/// How often the log is read for new events.
const POLL: Duration = Duration::from_millis(200);

/// How often an open event stream checks that its token is still live.
const RECHECK: Duration = Duration::from_secs(1);

/// `events`, ended within [`RECHECK`] of the token that opened it being revoked (with an
/// `error` event saying so): a revoked token reads nothing more, on a stream it already had
/// open too.
pub(crate) fn until_revoked<S>(
    server: Arc<Server>,
    headers: &HeaderMap,
    events: S,
) -> impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static
where
    S: futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    use futures_util::StreamExt;
    let presented = super::routes::presented(headers, Scope::Read).unwrap_or_default();
    let first_check = tokio::time::Instant::now() + RECHECK;
    futures_util::stream::unfold(
        (server, presented, Box::pin(events), first_check, false),
        move |(server, presented, mut events, mut next_check, ended)| async move {
            if ended {
                return None;
            }
            loop {
                // Checked when due, however fast events come.
                if tokio::time::Instant::now() >= next_check {
                    let live = super::auth::verify(&server.store, presented.trim()).await;
                    if !matches!(live, Ok(Some(_))) {
                        let event = Event::default()
                            .event("error")
                            .data("the token was revoked");
                        return Some((Ok(event), (server, presented, events, next_check, true)));
                    }
                    next_check = tokio::time::Instant::now() + RECHECK;
                }
                tokio::select! {
                    // Cancel-safe: a stream keeps its own progress between polls.
                    next = events.next() => {
                        return next.map(|event| (event, (server, presented, events, next_check, false)));
                    }
                    _ = tokio::time::sleep_until(next_check) => {}
                }
            }
        },
    )
}

#[derive(Debug, Deserialize)]
pub(crate) struct After {
    after: Option<String>,
}

/// Where an event stream resumes: after `Last-Event-ID`, else after `?after=`, else from the
/// start. Either one that is not an event id (a non-negative integer) is a 400: replaying the
/// stream from its start to a client that asked to resume would repeat what it already has.
#[allow(clippy::result_large_err)] // the error is the handler's answer, returned at once
pub(crate) fn resume_point(
    headers: &HeaderMap,
    after: Option<&str>,
    command: &str,
) -> Result<u64, Response> {
    let given = match headers.get("last-event-id") {
        Some(value) => Some(("Last-Event-ID", value.to_str().unwrap_or("\u{fffd}"))),
        None => after.map(|after| ("after", after)),
    };
    let Some((name, text)) = given else {
        return Ok(0);
    };
    text.trim().parse::<u64>().map_err(|_| {
        failure(
            StatusCode::BAD_REQUEST,
            command,
            "invalid_request",
            format!(
                "{name} `{}` is not an event id",
                crate::human::printable(text, false)
                    .chars()
                    .take(64)
                    .collect::<String>()
            ),
            Some("an event id is the `id:` of an event this stream sent (0 or more)"),
        )
    })
}

/// A mission's events, live.
#[utoipa::path(get, path = "/v1/missions/{id}/events", tag = "missions", security(("bearer" = [])),
    params(("id" = String, Path, description = "Mission id"),
           ("after" = Option<i64>, Query, description = "Only events after this sequence number (also `Last-Event-ID`)")),
    responses((status = 200, description = "`text/event-stream`: one `mission` event per logged event, `id` = its sequence number; `end` when the mission is over; `error` ends it when its token is revoked"),
              (status = 404, body = super::routes::ErrorBody)))]
pub(crate) async fn mission_events(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    Query(after): Query<After>,
    headers: HeaderMap,
) -> Response {
    let token = match authorize(&server, &headers, Scope::Read, "mission events").await {
        Ok(token) => token,
        Err(response) => return response,
    };
    if let Err(response) = owned_mission(&server, &token, &id, "mission events").await {
        return response;
    }
    let start = match resume_point(&headers, after.after.as_deref(), "mission events") {
        // Sequence numbers are SQLite integers; one past them resumes after every event.
        Ok(start) => i64::try_from(start).unwrap_or(i64::MAX),
        Err(response) => return response,
    };
    let server_for_recheck = server.clone();
    let stream = futures_util::stream::unfold(
        (server, id, start, false),
        |(server, id, mut last, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let events = match server.store.mission_events(&id).await {
                    Ok(events) => events,
                    Err(err) => {
                        let event = Event::default().event("error").data(err.to_string());
                        return Some((Ok::<_, Infallible>(vec![event]), (server, id, last, true)));
                    }
                };
                let fresh: Vec<Event> = events
                    .iter()
                    .filter(|(seq, _, _)| *seq > last)
                    .map(|(seq, body, _)| {
                        Event::default()
                            .id(seq.to_string())
                            .event("mission")
                            .data(body.as_str())
                    })
                    .collect();
                if let Some((seq, _, _)) = events.last() {
                    last = last.max(*seq);
                }
                let over = matches!(
                    server.store.mission_get(&id).await.map(|m| m.state),
                    Ok(ref state) if state != "running"
                );
                if over {
                    let mut batch = fresh;
                    batch.push(Event::default().event("end").data("the mission is over"));
                    return Some((Ok(batch), (server, id, last, true)));
                }
                if !fresh.is_empty() {
                    return Some((Ok(fresh), (server, id, last, false)));
                }
                tokio::time::sleep(POLL).await;
            }
        },
    );
    use futures_util::StreamExt;
    let flat = stream.flat_map(|batch: Result<Vec<Event>, Infallible>| {
        futures_util::stream::iter(
            batch
                .unwrap_or_default()
                .into_iter()
                .map(Ok::<_, Infallible>),
        )
    });
    Sse::new(until_revoked(server_for_recheck, &headers, flat))
        .keep_alive(KeepAlive::default())
        .into_response()
}
