//! The web dashboard: server-rendered pages over the same documents the API returns, and a
//! little JavaScript for the live event view (an `EventSource` on the mission's SSE route). No
//! build step, no external asset: one stylesheet inline.
//!
//! A browser signs in by pasting a token at `/ui/login`; it is kept in an `HttpOnly`,
//! `SameSite=Strict` cookie that authorizes **reads only** (every mutation needs the
//! `Authorization` header, so no page can be tricked into making one). Everything shown comes
//! from missions, agents and sandboxes — untrusted text — and is HTML-escaped.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde_json::Value;

use super::auth::{self, Scope};
use super::routes::authorize;
use super::Server;
use crate::output;

/// The cookie that carries a browser's token.
pub(crate) const COOKIE: &str = "berth_session";

/// Escapes text for HTML content and attribute values.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:0;color:#1d2330}\
nav{background:#1d2330;padding:10px 20px}nav a{color:#fff;margin-right:18px;text-decoration:none}\
main{padding:16px 24px}table{border-collapse:collapse;margin:8px 0 20px}\
td,th{border:1px solid #d5d9e0;padding:4px 8px;text-align:left;vertical-align:top}\
th{background:#f1f3f6}.accepted,.VERIFIED,.succeeded{color:#136f2d;font-weight:600}\
.rejected,.FAILED,.failed{color:#a11;font-weight:600}.UNKNOWN,.cancelled{color:#8a6100}\
.UNSUPPORTED{color:#777}pre{background:#f6f7f9;padding:8px;max-height:420px;overflow:auto}\
.bar{fill:#3b6fd4}.bar2{fill:#9db6ea}";

fn page(title: &str, body: &str) -> Response {
    Html(format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{} — Berth</title>\
         <style>{STYLE}</style></head><body><nav><a href=/ui>Missions</a>\
         <a href=/ui/ledger>Ledger</a><a href=/ui/catalog>Catalog</a>\
         <a href=/ui/bench>Benchmarks</a><a href=/ui/logout>Sign out</a></nav>\
         <main><h1>{}</h1>{body}</main></body></html>",
        esc(title),
        esc(title)
    ))
    .into_response()
}

/// Authorizes a page (read scope, header or cookie); unauthenticated browsers go to the login.
async fn reader(server: &Server, headers: &HeaderMap) -> Result<berth_store::ApiToken, Response> {
    match authorize(server, headers, Scope::Read, "ui").await {
        Ok(token) => Ok(token),
        Err(response) if response.status() == StatusCode::UNAUTHORIZED => {
            Err(Redirect::to("/ui/login").into_response())
        }
        Err(response) => Err(response),
    }
}

/// A command's document for the token's owner.
async fn document<F, Fut>(server: &Server, owner: &str, body: F) -> Result<Value, Response>
where
    F: FnOnce(Arc<crate::app::App>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<i32>>,
{
    let app = server
        .app_for(owner)
        .map(Arc::new)
        .map_err(|e| page("Error", &format!("<p>{}</p>", esc(&format!("{e:#}")))))?;
    let (result, doc) = output::capture(body(app)).await;
    match (result, doc) {
        (Ok(_), Some(doc)) => Ok(doc),
        (Err(err), _) => {
            let failed = crate::errors::classify(&err);
            Err(page("Error", &format!("<p>{}</p>", esc(&failed.message))))
        }
        (Ok(_), None) => Err(page("Error", "<p>no document</p>")),
    }
}

pub(crate) async fn login_form() -> Response {
    Html(format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Sign in — Berth</title>\
         <style>{STYLE}</style></head><body><main><h1>Berth</h1>\
         <form method=post action=/ui/login><label>Token <input id=token name=token \
         type=password size=80 autocomplete=off></label> <button id=signin>Sign in</button></form>\
         <p>Make one with <code>berth token create --owner YOU --scope read</code>.</p>\
         </main></body></html>"
    ))
    .into_response()
}

/// `POST /ui/login` (form `token=…`): sets the cookie when the token is live.
pub(crate) async fn login(State(server): State<Arc<Server>>, body: String) -> Response {
    let token = body
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
        .map(|v| v.replace('+', " "))
        .map(|v| percent_decode(&v))
        .unwrap_or_default();
    match auth::verify(&server.store, token.trim()).await {
        Ok(Some(_)) => (
            [(
                header::SET_COOKIE,
                format!(
                    "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
                    token.trim()
                ),
            )],
            Redirect::to("/ui"),
        )
            .into_response(),
        _ => (
            StatusCode::UNAUTHORIZED,
            Html("<!doctype html><p>Unknown or revoked token. <a href=/ui/login>Again</a></p>"),
        )
            .into_response(),
    }
}

pub(crate) async fn logout() -> Response {
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
        Redirect::to("/ui/login"),
    )
        .into_response()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/ui`: the owner's missions.
pub(crate) async fn missions(State(server): State<Arc<Server>>, headers: HeaderMap) -> Response {
    let token = match reader(&server, &headers).await {
        Ok(token) => token,
        Err(response) => return response,
    };
    let doc = match document(&server, &token.owner, |app| async move {
        crate::commands::mission::run(&app, crate::cli::MissionCommand::List).await
    })
    .await
    {
        Ok(doc) => doc,
        Err(response) => return response,
    };
    let mut body = String::from(
        "<table id=missions><tr><th>mission</th><th>name</th><th>state</th><th>events</th>\
         <th>created</th></tr>",
    );
    for m in doc["missions"].as_array().into_iter().flatten() {
        let id = text(&m["id"]);
        let state = text(&m["state"]);
        let _ = write!(
            body,
            "<tr><td><a href=\"/ui/missions/{0}\">{0}</a></td><td>{1}</td>\
             <td class=\"{2}\">{2}</td><td>{3}</td><td>{4}</td></tr>",
            esc(&id),
            esc(&text(&m["name"])),
            esc(&state),
            esc(&text(&m["events"])),
            esc(&text(&m["created_at"])),
        );
    }
    body.push_str("</table>");
    page(&format!("Missions of {}", token.owner), &body)
}

/// `/ui/missions/{id}`: tasks, attempts (verdicts, reasons, evidence, usage) and live events.
pub(crate) async fn mission(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let token = match reader(&server, &headers).await {
        Ok(token) => token,
        Err(response) => return response,
    };
    if let Err(response) = super::routes::owned_mission(&server, &token, &id, "ui").await {
        return response;
    }
    let wanted = id.clone();
    let doc = match document(&server, &token.owner, |app| async move {
        crate::commands::mission::run(&app, crate::cli::MissionCommand::Status { id: wanted }).await
    })
    .await
    {
        Ok(doc) => doc,
        Err(response) => return response,
    };
    let record = &doc["mission"];
    // Why it was cancelled is whatever the canceller wrote: escaped like the rest.
    let why = match record["state"]["reason"].as_str() {
        Some(reason) => format!(" (<span id=mission-reason>{}</span>)", esc(reason)),
        None => String::new(),
    };
    let mut body = format!(
        "<p>state: <b class=\"{0}\" id=mission-state>{0}</b>{why} · base commit <code>{1}</code></p>",
        esc(&text(&record["state"]["state"])),
        esc(&text(&doc["base_commit"]))
    );
    let facts: Vec<&Value> = doc["facts"].as_array().into_iter().flatten().collect();
    for task in record["tasks"].as_array().into_iter().flatten() {
        let _ = write!(
            body,
            "<h2>task {} <small class=\"{}\">{}</small></h2><table class=attempts>\
             <tr><th>#</th><th>attempt</th><th>verdict</th><th>reason</th><th>agent</th>\
             <th>validator</th><th>evidence / capture</th></tr>",
            esc(&text(&task["id"])),
            esc(&text(&task["state"]["state"])),
            esc(&text(&task["state"]["state"])),
        );
        for attempt in task["attempts"].as_array().into_iter().flatten() {
            let key = text(&attempt["key"]);
            let verdict = text(&attempt["status"]["status"]);
            let fact = |kind: &str| {
                facts
                    .iter()
                    .find(|f| f["attempt"] == key.as_str() && f["kind"] == kind)
                    .map(|f| &f["detail"])
            };
            let run = |detail: Option<&Value>| match detail {
                Some(d) => format!(
                    "{} {} ({:.0} ms)",
                    text(&d["status"]["status"]),
                    text(&d["status"]["code"]),
                    d["duration_ms"].as_f64().unwrap_or(f64::NAN)
                ),
                None => String::new(),
            };
            let capture = fact("capture")
                .map(|d| format!("{} files, commit {}", text(&d["files"]), text(&d["commit"])))
                .unwrap_or_default();
            let _ = write!(
                body,
                "<tr class=attempt data-verdict=\"{1}\"><td>{0}</td><td><code>{2}</code></td>\
                 <td class=\"{1}\">{1}</td><td>{3}</td><td>{4}</td><td>{5}</td><td>{6}</td></tr>",
                esc(&text(&attempt["ordinal"])),
                esc(&verdict),
                esc(&key),
                esc(&text(&attempt["status"]["reason"])),
                esc(&run(fact("agent"))),
                esc(&run(fact("validator"))),
                esc(&capture),
            );
        }
        body.push_str("</table>");
    }
    let _ = write!(
        body,
        "<h2>Events <small id=live>connecting…</small></h2><pre id=events></pre>\
         <script>\
         const out=document.getElementById('events'),live=document.getElementById('live');\
         const es=new EventSource('/v1/missions/{}/events');\
         es.addEventListener('mission',e=>{{out.append(document.createTextNode('#'+e.lastEventId+' '+e.data+'\\n'));\
         live.textContent='live';}});\
         es.addEventListener('end',e=>{{live.textContent='ended';es.close();}});\
         es.onerror=()=>{{if(live.textContent!=='ended')live.textContent='reconnecting…';}};\
         </script>",
        esc(&id)
    );
    page(&format!("Mission {id}"), &body)
}

/// `/ui/ledger`: what the owner created and its teardown.
pub(crate) async fn ledger(State(server): State<Arc<Server>>, headers: HeaderMap) -> Response {
    let token = match reader(&server, &headers).await {
        Ok(token) => token,
        Err(response) => return response,
    };
    let doc = match document(&server, &token.owner, |app| async move {
        crate::commands::ledger::list(&app, true).await
    })
    .await
    {
        Ok(doc) => doc,
        Err(response) => return response,
    };
    let mut body = String::from(
        "<table id=ledger><tr><th>id</th><th>kind</th><th>provider</th><th>state</th>\
         <th>run</th><th>created</th><th>verified gone</th><th>last error</th></tr>",
    );
    for row in doc["entries"].as_array().into_iter().flatten() {
        // Whether the row's run is still live (a sweep holds its unexpired rows), or why that
        // is unknown.
        let run = match row["run_live"].as_bool() {
            Some(true) => "<td class=live>live</td>".to_owned(),
            Some(false) => "<td class=over>over</td>".to_owned(),
            None => format!(
                "<td class=UNKNOWN title=\"{}\">UNKNOWN</td>",
                esc(&text(&row["run_live_unknown"]))
            ),
        };
        let _ = write!(
            body,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>{run}<td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            esc(&text(&row["berth_id"])),
            esc(&text(&row["kind"])),
            esc(&text(&row["provider"])),
            esc(&text(&row["state"])),
            esc(&text(&row["created_at"])),
            esc(&text(&row["verified_gone_at"])),
            esc(&text(&row["last_error"])),
        );
    }
    body.push_str("</table>");
    page("Ledger", &body)
}

/// `/ui/catalog`: every provider's capabilities with their evidence status.
pub(crate) async fn catalog(State(server): State<Arc<Server>>, headers: HeaderMap) -> Response {
    let token = match reader(&server, &headers).await {
        Ok(token) => token,
        Err(response) => return response,
    };
    let config = server.config.clone();
    let doc = match document(&server, &token.owner, |_app| async move {
        let show = crate::cli::CatalogCommand::Show {
            provider: None,
            source: crate::cli::EvidenceSource {
                catalog: None,
                evidence: None,
                trust_keys: Vec::new(),
            },
        };
        crate::commands::catalog::run(&config, true, &show)
    })
    .await
    {
        Ok(doc) => doc,
        Err(response) => return response,
    };
    let providers: Vec<&Value> = doc["providers"].as_array().into_iter().flatten().collect();
    let mut capabilities: Vec<String> = providers
        .iter()
        .flat_map(|p| p["capabilities"].as_object().into_iter().flatten())
        .map(|(k, _)| k.clone())
        .collect();
    capabilities.sort();
    capabilities.dedup();
    let mut body = String::from("<table id=catalog><tr><th>capability</th>");
    for p in &providers {
        let _ = write!(body, "<th>{}</th>", esc(&text(&p["id"])));
    }
    body.push_str("</tr>");
    for capability in &capabilities {
        let _ = write!(body, "<tr><td>{}</td>", esc(capability));
        for p in &providers {
            let cell = &p["capabilities"][capability.as_str()];
            let status = text(&cell["status"]);
            let _ = write!(
                body,
                "<td class=\"{0}\" title=\"{1}\">{0}</td>",
                esc(&status),
                esc(&text(&cell["reason"]))
            );
        }
        body.push_str("</tr>");
    }
    body.push_str("</table><h2>Evidence</h2><table><tr><th>provider</th><th>record</th></tr>");
    for p in &providers {
        let evidence = &p["evidence"];
        let summary = if evidence.is_null() {
            "none".to_owned()
        } else {
            format!(
                "verified {} · {} · kernel {} · adapter {} · signed by {} ({})",
                text(&evidence["finished_at"]),
                text(&evidence["observed"]),
                text(&evidence["kernel"]),
                text(&evidence["adapter_source_hash"]),
                text(&evidence["signed_by"]),
                text(&evidence["origin"]["kind"]),
            )
        };
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td></tr>",
            esc(&text(&p["id"])),
            esc(&summary)
        );
    }
    body.push_str("</table>");
    page("Catalog", &body)
}

/// One horizontal bar chart (SVG): labelled pairs of (p50, p95) in milliseconds.
fn bars(id: &str, rows: &[(String, f64, f64)]) -> String {
    let max = rows
        .iter()
        .map(|(_, _, p95)| *p95)
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max);
    let height = 24 * rows.len() + 24;
    let mut svg = format!(
        "<svg id=\"{}\" class=chart width=860 height={height} role=img>",
        esc(id)
    );
    for (i, (label, p50, p95)) in rows.iter().enumerate() {
        let y = 24 * i + 4;
        let w95 = (p95 / max * 440.0).max(1.0);
        let w50 = (p50 / max * 440.0).max(1.0);
        let _ = write!(
            svg,
            "<text x=0 y={} font-size=12>{}</text>\
             <rect class=bar2 x=200 y={y} width={w95:.1} height=16><title>p95 {p95:.1} ms</title></rect>\
             <rect class=bar x=200 y={y} width={w50:.1} height=16><title>p50 {p50:.1} ms</title></rect>\
             <text x={} y={} font-size=11>{p50:.1} / {p95:.1} ms</text>",
            y + 12,
            esc(label),
            205.0 + w95,
            y + 12
        );
    }
    svg.push_str("</svg>");
    svg
}

/// `/ui/bench`: every benchmark record under `$BERTH_HOME/bench/` (`berth bench … --out`),
/// charted: time to interactive per provider, and each phase of the cycle (p50 dark, p95
/// light).
pub(crate) async fn bench(State(server): State<Arc<Server>>, headers: HeaderMap) -> Response {
    if let Err(response) = reader(&server, &headers).await {
        return response;
    }
    let dir = server.config.home.join("bench");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut body = format!(
        "<p>Records in <code>{}</code> (write one with <code>berth bench host bwrap docker \
         --out {}/NAME.json</code>).</p>",
        esc(&dir.display().to_string()),
        esc(&dir.display().to_string())
    );
    let mut charts = 0;
    for file in files {
        // Bounded: a record is small; anything larger is not one of ours.
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        if !meta.is_file() || meta.len() > (4 << 20) {
            continue;
        }
        let Some(record) = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        else {
            continue;
        };
        if record["version"] != "berth.bench/v1" {
            continue;
        }
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let results: Vec<&Value> = record["results"].as_array().into_iter().flatten().collect();
        let tti: Vec<(String, f64, f64)> = results
            .iter()
            .map(|r| {
                (
                    format!("{} ({})", text(&r["provider"]), text(&r["mode"])),
                    r["summary"]["ttiMs"]["median"].as_f64().unwrap_or(f64::NAN),
                    r["summary"]["ttiMs"]["p95"].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect();
        let _ = write!(
            body,
            "<h2>{} <small>{}</small></h2><p>p50 dark, p95 light, milliseconds</p>\
             <h3>Time to interactive</h3>{}",
            esc(&name),
            esc(&text(&record["timestamp"])),
            bars(&format!("tti-{charts}"), &tti)
        );
        for r in &results {
            let phases: Vec<(String, f64, f64)> = r["summary"]["phasesMs"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(phase, s)| {
                    (
                        phase.clone(),
                        s["median"].as_f64().unwrap_or(f64::NAN),
                        s["p95"].as_f64().unwrap_or(f64::NAN),
                    )
                })
                .collect();
            let _ = write!(
                body,
                "<h3>Cycle phases: {}</h3>{}",
                esc(&text(&r["provider"])),
                bars(&format!("phases-{charts}"), &phases)
            );
            charts += 1;
        }
    }
    if charts == 0 {
        body.push_str("<p id=no-bench>No benchmark records yet.</p>");
    }
    page("Benchmarks", &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_text_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }

    #[test]
    fn form_values_are_decoded() {
        assert_eq!(percent_decode("berth_ab%2Bc"), "berth_ab+c");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
