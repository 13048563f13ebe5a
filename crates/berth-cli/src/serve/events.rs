//! A mission's event log as server-sent events: each event's id is its sequence number, so a
//! client that reconnects with `Last-Event-ID: N` (or `?after=N`) gets exactly the events after
//! N — the log is durable, so nothing is lost across a reconnect or a server restart. The
//! stream ends after the mission's final event.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use berth_store::MissionStore;
use serde::Deserialize;

use super::auth::Scope;
use super::routes::{authorize, owned_mission};
use super::Server;

/// How often the log is read for new events.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Deserialize)]
pub(crate) struct After {
    after: Option<i64>,
}

/// A mission's events, live.
#[utoipa::path(get, path = "/v1/missions/{id}/events", tag = "missions", security(("bearer" = [])),
    params(("id" = String, Path, description = "Mission id"),
           ("after" = Option<i64>, Query, description = "Only events after this sequence number (also `Last-Event-ID`)")),
    responses((status = 200, description = "`text/event-stream`: one `mission` event per logged event, `id` = its sequence number; `end` when the mission is over"),
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
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let start = resume.or(after.after).unwrap_or(0);
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
    Sse::new(flat)
        .keep_alive(KeepAlive::default())
        .into_response()
}
