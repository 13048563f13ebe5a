//! `berth bench serve`: the HTTP API under load, on loopback, in a scratch `BERTH_HOME`.
//!
//! Two measurements in one run:
//! - **The CLI as a whole process** against the API, one caller, the same operations (list;
//!   create then destroy a host sandbox): what a script pays per `berth` call against what a
//!   client of `berth serve` pays per request.
//! - **Load**: N clients at once for a fixed time — half list, half create and destroy host
//!   sandboxes — each on its own kept-alive connection; latency percentiles per operation,
//!   errors (any answer but 200), and what is left afterwards (must be nothing). Then the
//!   server is SIGKILLed and started again on the same store, and must still answer.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use crate::{bail, BenchContext, BenchError, Report, Result, WithContext};

/// A kept-alive connection to `berth serve`.
struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    authority: String,
    auth: String,
}

impl Client {
    async fn connect(authority: &str, token: &str) -> Result<Client> {
        let stream = tokio::net::TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| BenchError::Invalid(format!("serve handshake: {e}")))?;
        tokio::spawn(connection);
        Ok(Client {
            sender,
            authority: authority.to_owned(),
            auth: format!("Bearer {token}"),
        })
    }

    /// One request: its status and document.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.authority)
            .header("authorization", &self.auth);
        let body = match body {
            Some(body) => {
                request = request.header("content-type", "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(body))
            .map_err(|e| BenchError::Invalid(e.to_string()))?;
        self.sender
            .ready()
            .await
            .map_err(|e| BenchError::Invalid(format!("serve connection: {e}")))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| BenchError::Invalid(format!("serve request: {e}")))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| BenchError::Invalid(format!("serve body: {e}")))?
            .to_bytes();
        let doc = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, doc))
    }
}

/// A `berth serve` process on a free loopback port.
struct Served {
    child: tokio::process::Child,
    authority: String,
}

async fn start(berth: &Path, home: &Path) -> Result<Served> {
    let mut child = tokio::process::Command::new(berth)
        // Host sandboxes, in a scratch home of its own, on loopback.
        .args(["serve", "--listen", "127.0.0.1:0", "--allow-unisolated"])
        .env("BERTH_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start berth serve")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::Invalid("berth serve has no stdout".into()))?;
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .map_err(|_| BenchError::Invalid("berth serve did not start within 30 s".into()))??;
    let authority = line
        .trim()
        .strip_prefix("listening on http://")
        .ok_or_else(|| BenchError::Invalid(format!("berth serve printed {line:?}")))?
        .to_owned();
    Ok(Served { child, authority })
}

async fn berth_json(berth: &Path, home: &Path, args: &[&str]) -> Result<(Duration, Value)> {
    let started = Instant::now();
    let out = tokio::process::Command::new(berth)
        .arg("--json")
        .args(args)
        .env("BERTH_HOME", home)
        .env("BERTH_OWNER", "bench-serve")
        .stdin(Stdio::null())
        .output()
        .await
        .context("run berth")?;
    let took = started.elapsed();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    if !out.status.success() {
        bail!("berth {args:?} failed: {doc}");
    }
    Ok((took, doc))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentiles(samples: &mut [f64]) -> Value {
    let at = |s: &mut [f64], p: f64| crate::stats::percentile(s, p).unwrap_or(f64::NAN);
    json!({
        "n": samples.len(),
        "p50_ms": at(samples, 0.5),
        "p95_ms": at(samples, 0.95),
        "p99_ms": at(samples, 0.99),
    })
}

fn median(samples: &mut [f64]) -> f64 {
    crate::stats::median(samples).unwrap_or(f64::NAN)
}

/// `berth bench serve`.
pub async fn bench(ctx: &BenchContext, clients: usize, duration: Duration) -> Result<Report> {
    let clients = clients.max(2);
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-serve-")
        .tempdir_in(&ctx.home)?;
    let home = scratch.path();
    let (_, doc) = berth_json(
        &ctx.berth,
        home,
        &[
            "token",
            "create",
            "--owner",
            "bench-serve",
            "--scope",
            "exec",
        ],
    )
    .await?;
    let token = doc["token"]
        .as_str()
        .ok_or_else(|| BenchError::Invalid(format!("no token in {doc}")))?
        .to_owned();
    let mut served = start(&ctx.berth, home).await?;

    // One caller: the CLI as a process against the API, same operations, alternating.
    let rounds = 10;
    let (mut cli_list, mut api_list, mut cli_cycle, mut api_cycle) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut client = Client::connect(&served.authority, &token).await?;
    for round in 0..rounds {
        ctx.progress
            .say(&format!("serve bench: one caller, round {round}/{rounds}"));
        let (took, _) = berth_json(&ctx.berth, home, &["list"]).await?;
        cli_list.push(ms(took));
        let started = Instant::now();
        let (status, doc) = client.call("GET", "/v1/sandboxes", None).await?;
        if status != 200 {
            bail!("list answered {status}: {doc}");
        }
        api_list.push(ms(started.elapsed()));
        let started = Instant::now();
        let (_, doc) = berth_json(&ctx.berth, home, &["create"]).await?;
        let id = doc["sandbox"]["berth_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        berth_json(&ctx.berth, home, &["destroy", &id]).await?;
        cli_cycle.push(ms(started.elapsed()));
        let started = Instant::now();
        let (status, doc) = client
            .call("POST", "/v1/sandboxes", Some(json!({})))
            .await?;
        if status != 200 {
            bail!("create answered {status}: {doc}");
        }
        let id = doc["sandbox"]["berth_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let (status, doc) = client
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .await?;
        if status != 200 {
            bail!("destroy answered {status}: {doc}");
        }
        api_cycle.push(ms(started.elapsed()));
    }

    // Load.
    ctx.progress.say(&format!(
        "serve bench: {clients} clients for {} s",
        duration.as_secs()
    ));
    let until = Instant::now() + duration;
    let mut set = tokio::task::JoinSet::new();
    for n in 0..clients {
        let (authority, token) = (served.authority.clone(), token.clone());
        set.spawn(async move {
            let mut client = Client::connect(&authority, &token).await?;
            let (mut lists, mut cycles, mut errors) = (Vec::new(), Vec::new(), Vec::new());
            while Instant::now() < until {
                let started = Instant::now();
                if n % 2 == 0 {
                    let (status, doc) = client.call("GET", "/v1/sandboxes", None).await?;
                    if status == 200 {
                        lists.push(ms(started.elapsed()));
                    } else {
                        errors.push(format!("list {status}: {doc}"));
                    }
                } else {
                    let (status, doc) = client
                        .call("POST", "/v1/sandboxes", Some(json!({})))
                        .await?;
                    let Some(id) = doc["sandbox"]["berth_id"]
                        .as_str()
                        .filter(|_| status == 200)
                    else {
                        errors.push(format!("create {status}: {doc}"));
                        continue;
                    };
                    let (status, doc) = client
                        .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
                        .await?;
                    if status == 200 {
                        cycles.push(ms(started.elapsed()));
                    } else {
                        errors.push(format!("destroy {status}: {doc}"));
                    }
                }
            }
            Ok::<_, BenchError>((lists, cycles, errors))
        });
    }
    let (mut lists, mut cycles, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(joined) = set.join_next().await {
        let (l, c, e) =
            joined.map_err(|e| BenchError::Invalid(format!("a client panicked: {e}")))??;
        lists.extend(l);
        cycles.extend(c);
        errors.extend(e);
    }
    let requests = lists.len() + 2 * cycles.len();
    let (_, doc) = client.call("GET", "/v1/sandboxes", None).await?;
    let left = doc["sandboxes"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(usize::MAX);

    // SIGKILL and restart on the same store.
    let _ = served.child.start_kill();
    let _ = served.child.wait().await;
    served = start(&ctx.berth, home).await?;
    let mut after = Client::connect(&served.authority, &token).await?;
    let (restarted_status, _) = after.call("GET", "/v1/sandboxes", None).await?;
    let _ = served.child.start_kill();
    let _ = served.child.wait().await;

    let doc = json!({
        "one_caller": {
            "baseline": "the CLI as a whole process (a `berth` call per operation) against the API (a request per operation on a kept-alive connection), same operations, same store, alternating",
            "list": { "cli_median_ms": median(&mut cli_list), "api_median_ms": median(&mut api_list) },
            "create_destroy_host": { "cli_median_ms": median(&mut cli_cycle), "api_median_ms": median(&mut api_cycle) },
            "rounds": rounds,
        },
        "load": {
            "clients": clients,
            "duration_s": duration.as_secs_f64(),
            "requests": requests,
            "requests_per_s": requests as f64 / duration.as_secs_f64(),
            "list": percentiles(&mut lists),
            "create_destroy_host": percentiles(&mut cycles),
            "errors": errors.len(),
            "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
            "sandboxes_left": left,
        },
        "restart_after_sigkill": { "status": restarted_status },
    });
    let mut text = String::new();
    use std::fmt::Write as _;
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let _ = writeln!(
        text,
        "one caller (the CLI as a whole process vs the API, same operations, n={rounds}): list {:.1} ms vs {:.1} ms; create+destroy host {:.1} ms vs {:.1} ms",
        f(&doc["one_caller"]["list"]["cli_median_ms"]),
        f(&doc["one_caller"]["list"]["api_median_ms"]),
        f(&doc["one_caller"]["create_destroy_host"]["cli_median_ms"]),
        f(&doc["one_caller"]["create_destroy_host"]["api_median_ms"]),
    );
    let _ = writeln!(
        text,
        "load ({clients} clients, {} s): {requests} requests ({:.0}/s), {} errors, {left} sandboxes left",
        duration.as_secs(),
        f(&doc["load"]["requests_per_s"]),
        errors.len()
    );
    for op in ["list", "create_destroy_host"] {
        let _ = writeln!(
            text,
            "  {op}: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms (n={})",
            f(&doc["load"][op]["p50_ms"]),
            f(&doc["load"][op]["p95_ms"]),
            f(&doc["load"][op]["p99_ms"]),
            doc["load"][op]["n"]
        );
    }
    let _ = writeln!(
        text,
        "after SIGKILL and restart on the same store: GET /v1/sandboxes answered {restarted_status}"
    );
    if !errors.is_empty() || left != 0 || restarted_status != 200 {
        return Err(BenchError::Invalid(format!(
            "the load left errors or sandboxes, or the restart failed:\n{text}"
        )));
    }
    Ok(Report { json: doc, text })
}
