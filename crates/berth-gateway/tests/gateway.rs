//! The gateway over real HTTP on a loopback port: the three dialects, streamed and not, the
//! attempt tokens, the journal, and the proxy keeping the credential on the host.

use std::sync::Arc;

use berth_gateway::{
    journal::JOURNAL_SCHEMA, Gateway, GatewayConfig, Journal, Price, Prices, Proxy, Script,
    Upstream,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

const SCRIPT: &str = r#"
schema_version = 1
side_text = "A title"
[[step]]
shell = "printf hi > hello.txt"
[[step]]
write = { path = "notes/a.txt", content = "two\nlines" }
[[step]]
error = { status = 503, message = "scripted outage" }
[[step]]
text = "Done"
usage = { input = 1000, output = 50, cached = 600 }
"#;

fn scripted(prices: Option<Prices>) -> Gateway {
    Gateway::new(GatewayConfig {
        upstream: Upstream::Scripted(Arc::new(Script::parse(SCRIPT).unwrap())),
        prices,
    })
}

/// POSTs `body` to `url` with `headers`; the status and the whole body.
async fn post(url: &str, headers: &[(&str, &str)], body: &Value) -> (u16, String) {
    let uri: hyper::Uri = url.parse().unwrap();
    let authority = uri.authority().unwrap().clone();
    let stream = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut request = hyper::Request::post(uri.path_and_query().unwrap().as_str())
        .header("host", authority.as_str())
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(
            request
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn sse_events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn chat_request(tool_results: usize, stream: bool) -> Value {
    let mut messages =
        vec![json!({"role": "system", "content": "Working directory: /work/repo\n"})];
    for _ in 0..tool_results {
        messages.push(json!({"role": "tool", "tool_call_id": "c", "content": "ok"}));
    }
    json!({
        "model": "scripted-model", "stream": stream,
        "stream_options": {"include_usage": true},
        "messages": messages,
        "tools": [
            {"type": "function", "function": {"name": "bash", "parameters": {"properties": {"command": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "write", "parameters": {"properties": {"filePath": {}, "content": {}}}}},
        ],
    })
}

#[tokio::test]
async fn chat_completions_follow_the_script_streamed_and_not() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = scripted(None);
    let token = gateway.admit("m1:t1:a1", dir.path().join("journal.jsonl"));
    let running = gateway.listen(0).await.unwrap();
    let url = format!("{}/v1/chat/completions", running.base_url());
    let auth = format!("Bearer {}", token.expose());
    let headers = [("authorization", auth.as_str())];

    // Step 0, not streamed: a bash call.
    let (status, body) = post(&url, &headers, &chat_request(0, false)).await;
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let call = &doc["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "bash");
    assert_eq!(
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"command": "printf hi > hello.txt"})
    );
    assert_eq!(doc["choices"][0]["finish_reason"], "tool_calls");

    // Step 1, streamed: the write tool with an absolute path from the prompt's directory.
    let (status, body) = post(&url, &headers, &chat_request(1, true)).await;
    assert_eq!(status, 200);
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let events = sse_events(&body);
    let call = &events[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "write");
    assert_eq!(
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"filePath": "/work/repo/notes/a.txt", "content": "two\nlines"})
    );
    assert_eq!(events.last().unwrap()["usage"]["prompt_tokens"], 100);

    // Step 2: the scripted error, in OpenAI's shape.
    let (status, body) = post(&url, &headers, &chat_request(2, true)).await;
    assert_eq!(status, 503);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["message"],
        "scripted outage"
    );

    // Step 3 and beyond: the final text, repeated.
    for results in [3, 7] {
        let (_, body) = post(&url, &headers, &chat_request(results, false)).await;
        let doc: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(doc["choices"][0]["message"]["content"], "Done");
        assert_eq!(doc["usage"]["prompt_tokens_details"]["cached_tokens"], 600);
    }

    // A request without tools (a title) gets the side text.
    let (_, body) = post(
        &url,
        &headers,
        &json!({"model": "m", "messages": [{"role": "user", "content": "title?"}]}),
    )
    .await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["choices"][0]["message"]["content"], "A title");
}

#[tokio::test]
async fn responses_and_messages_speak_their_own_dialects() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = scripted(None);
    let token = gateway.admit("m1:t1:a1", dir.path().join("journal.jsonl"));
    let running = gateway.listen(0).await.unwrap();
    let base = running.base_url();
    let bearer = format!("Bearer {}", token.expose());

    // Responses (Codex): exec_command takes `cmd`; apply_patch is freeform.
    let responses = |results: usize, stream: bool| {
        let mut input = vec![
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context><cwd>/w</cwd></environment_context>"}]}),
        ];
        for _ in 0..results {
            input.push(json!({"type": "function_call_output", "call_id": "c", "output": "ok"}));
        }
        json!({"model": "gpt-5.5", "stream": stream, "input": input, "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"properties": {"cmd": {}}}},
            {"type": "custom", "name": "apply_patch"},
        ]})
    };
    let url = format!("{base}/v1/responses");
    let (status, body) = post(&url, &[("authorization", &bearer)], &responses(0, true)).await;
    assert_eq!(status, 200);
    let events = sse_events(&body);
    let kinds: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"));
    assert!(kinds.contains(&"response.function_call_arguments.done"));
    let item = &events.last().unwrap()["response"]["output"][0];
    assert_eq!(item["name"], "exec_command");
    assert_eq!(
        item["arguments"],
        json!({"cmd": "printf hi > hello.txt"}).to_string()
    );
    // sequence numbers count up from 0
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], n as u64);
    }
    let (_, body) = post(&url, &[("authorization", &bearer)], &responses(1, false)).await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["output"][0]["type"], "custom_tool_call");
    assert_eq!(
        doc["output"][0]["input"],
        "*** Begin Patch\n*** Add File: /w/notes/a.txt\n+two\n+lines\n*** End Patch"
    );

    // Anthropic Messages (Claude Code): x-api-key, Bash with a description, tool_result blocks.
    let messages = |results: usize, stream: bool| {
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for _ in 0..results {
            messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}));
        }
        json!({"model": "claude-x", "stream": stream, "messages": messages,
               "system": [{"type": "text", "text": "Working directory: /c\n"}],
               "tools": [{"name": "Bash", "input_schema": {"properties": {"command": {}, "description": {}}}},
                         {"name": "Write", "input_schema": {"properties": {"file_path": {}, "content": {}}}}]})
    };
    let url = format!("{base}/v1/messages?beta=true");
    let key = token.expose().to_owned();
    let (status, body) = post(&url, &[("x-api-key", &key)], &messages(0, true)).await;
    assert_eq!(status, 200, "{body}");
    let events = sse_events(&body);
    let kinds: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[1]["content_block"]["name"], "Bash");
    assert_eq!(
        serde_json::from_str::<Value>(events[2]["delta"]["partial_json"].as_str().unwrap())
            .unwrap(),
        json!({"command": "printf hi > hello.txt", "description": "Scripted step"})
    );
    assert_eq!(events[4]["delta"]["stop_reason"], "tool_use");
    let (_, body) = post(&url, &[("x-api-key", &key)], &messages(1, false)).await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc["content"][0]["input"],
        json!({"file_path": "/c/notes/a.txt", "content": "two\nlines"})
    );
    let (status, body) = post(&url, &[("x-api-key", &key)], &messages(2, false)).await;
    assert_eq!(status, 503);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["type"],
        "api_error"
    );
    // Cached tokens counted once: Anthropic's input_tokens exclude cache reads.
    let (_, body) = post(&url, &[("x-api-key", &key)], &messages(3, false)).await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["usage"]["input_tokens"], 400);
    assert_eq!(doc["usage"]["cache_read_input_tokens"], 600);
}

#[tokio::test]
async fn unknown_and_revoked_tokens_are_refused_and_not_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let gateway = scripted(None);
    let token = gateway.admit("a", journal.clone());
    let running = gateway.listen(0).await.unwrap();
    let url = format!("{}/v1/chat/completions", running.base_url());
    for headers in [
        vec![],
        vec![("authorization", "Bearer berth-gw-forged")],
        vec![("x-api-key", "sk-anything")],
    ] {
        let (status, body) = post(&url, &headers, &chat_request(0, false)).await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("unknown or revoked attempt token"));
    }
    let auth = format!("Bearer {}", token.expose());
    assert_eq!(
        post(&url, &[("authorization", &auth)], &chat_request(0, false))
            .await
            .0,
        200
    );
    gateway.revoke(&token);
    assert_eq!(
        post(&url, &[("authorization", &auth)], &chat_request(0, false))
            .await
            .0,
        401
    );
    assert_eq!(Journal::read(&journal).unwrap().len(), 1);
}

#[tokio::test]
async fn the_journal_keeps_requests_redacted_with_usage_and_cost() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let mut prices = Prices::default();
    prices.models.insert(
        "scripted-model".into(),
        Price {
            input: 2.0,
            output: 10.0,
            cached_input: Some(0.5),
        },
    );
    let gateway = scripted(Some(prices));
    let token = gateway.admit("m1:t1:a1", journal.clone());
    let running = gateway.listen(0).await.unwrap();
    let url = format!("{}/v1/chat/completions", running.base_url());
    let auth = format!("Bearer {}", token.expose());
    post(&url, &[("authorization", &auth)], &chat_request(0, true)).await;
    post(&url, &[("authorization", &auth)], &chat_request(3, false)).await;
    let mut unpriced = chat_request(3, false);
    unpriced["model"] = json!("other-model");
    // A tool's output carrying a token-shaped secret (what `cat ~/.config/gh/hosts.yml` in
    // the sandbox would send back): masked before the journal line is written.
    let leaked = format!("ghp_{}", "Zx9".repeat(12));
    unpriced["messages"][1]["content"] = json!(format!("oauth_token: {leaked}"));
    post(&url, &[("authorization", &auth)], &unpriced).await;

    let entries = Journal::read(&journal).unwrap();
    assert_eq!(entries.len(), 3);
    assert!(entries.iter().all(|e| e.schema == JOURNAL_SCHEMA
        && e.attempt == "m1:t1:a1"
        && e.request_headers["authorization"] == "[redacted]"));
    assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!((entries[0].step, entries[0].stream), (Some(0), true));
    let usage = entries[1].usage.unwrap();
    assert_eq!((usage.input, usage.output, usage.cached), (1000, 50, 600));
    // (400 × 2 + 600 × 0.5 + 50 × 10) / 1e6
    let cost = entries[1].cost_usd.unwrap();
    assert!((cost - 0.0016).abs() < 1e-12, "{cost}");
    assert_eq!(entries[2].cost_usd, None);
    assert_eq!(
        entries[2].cost_unknown.as_deref(),
        Some("no price for model `other-model`")
    );
    let text = std::fs::read_to_string(&journal).unwrap();
    assert!(
        !text.contains(token.expose()),
        "the token leaked into the journal"
    );
    assert!(
        !text.contains(&leaked),
        "a tool's secret leaked into the journal"
    );
    assert!(text.contains(&format!("oauth_token: {}", "*".repeat(leaked.len()))));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&journal).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[tokio::test]
async fn the_proxy_adds_the_credential_which_reaches_the_upstream_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    // The "real endpoint": a scripted gateway whose only accepted key is the credential.
    let upstream = scripted(None);
    let credential = upstream.admit("upstream", dir.path().join("upstream.jsonl"));
    let upstream_running = upstream.listen(0).await.unwrap();

    let proxy = Gateway::new(GatewayConfig {
        upstream: Upstream::Proxy(Arc::new(
            Proxy::new(&upstream_running.base_url(), credential.expose().to_owned()).unwrap(),
        )),
        prices: None,
    });
    let journal = dir.path().join("proxy.jsonl");
    let token = proxy.admit("m1:t1:a1", journal.clone());
    let running = proxy.listen(0).await.unwrap();

    // Streamed Chat through the proxy: the upstream accepted the credential it added.
    let auth = format!("Bearer {}", token.expose());
    let url = format!("{}/v1/chat/completions", running.base_url());
    let (status, body) = post(&url, &[("authorization", &auth)], &chat_request(0, true)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("printf hi > hello.txt"));
    // Anthropic through the proxy: the credential goes as x-api-key.
    let url = format!("{}/v1/messages", running.base_url());
    let (status, body) = post(
        &url,
        &[("x-api-key", token.expose())],
        &json!({"model": "c", "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "Bash", "input_schema": {"properties": {"command": {}}}}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The real credential, presented to the proxy as if it were a token, is refused.
    let forged = format!("Bearer {}", credential.expose());
    let url = format!("{}/v1/chat/completions", running.base_url());
    assert_eq!(
        post(&url, &[("authorization", &forged)], &chat_request(0, false))
            .await
            .0,
        401
    );

    // Journaled with usage read from the upstream's stream; the credential is in no line.
    let entries = Journal::read(&journal).unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].upstream, "proxy");
    assert_eq!(entries[0].usage.map(|u| u.input), Some(100));
    for file in ["proxy.jsonl", "upstream.jsonl"] {
        let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
        assert!(
            !text.contains(credential.expose()),
            "the credential leaked into {file}"
        );
    }
    // The upstream saw the proxy's requests, not the sandbox's token.
    let upstream_text = std::fs::read_to_string(dir.path().join("upstream.jsonl")).unwrap();
    assert!(!upstream_text.contains(token.expose()));

    // An unreachable upstream is a 502 in the dialect's shape, journaled.
    drop(upstream_running);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (status, _) = post(&url, &[("authorization", &auth)], &chat_request(0, false)).await;
    assert_eq!(status, 502);
    assert_eq!(Journal::read(&journal).unwrap().len(), 3);
}

#[test]
fn proxy_origins_are_checked() {
    for (origin, why) in [
        ("ftp://x", "scheme must be http or https"),
        ("https://[::1", "not a URL"),
        ("http://host:1/v1", "origin only"),
        ("not a url", "not a URL"),
    ] {
        let err = Proxy::new(origin, "k".into()).unwrap_err().to_string();
        assert!(err.contains(why), "{origin}: {err}");
    }
    assert!(Proxy::new("http://127.0.0.1:9", "k\nx".into()).is_err());
    let debug = format!(
        "{:?}",
        Proxy::new("http://127.0.0.1:9", "sk-canary".into()).unwrap()
    );
    assert!(!debug.contains("sk-canary"), "{debug}");
}

/// A connection handed in from elsewhere (how a sandbox's loopback forward arrives) is served
/// like one on the port, token checks included; after the gateway stops, none is taken.
#[tokio::test]
async fn handed_in_connections_are_served_and_refused_after_stop() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let gateway = scripted(None);
    let token = gateway.admit("m1:t1:a1", dir.path().join("journal.jsonl"));
    let running = gateway.listen(0).await.unwrap();
    let connections = running.connections();
    let exchange = |auth: String| {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        connections.serve(theirs).unwrap();
        tokio::task::spawn_blocking(move || {
            let body = chat_request(0, false).to_string();
            let mut ours = ours;
            // A refused request is answered before its body is read, and the connection
            // closed: the write may then fail, the answer is still there to read.
            let _ = write!(
                ours,
                "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: {auth}\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let mut answer = String::new();
            let _ = ours.read_to_string(&mut answer);
            answer
        })
    };
    let answer = exchange(format!("Bearer {}", token.expose()))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("printf hi > hello.txt"), "{answer}");
    let refused = exchange("Bearer berth-gw-not-a-token".into())
        .await
        .unwrap();
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");

    running.stop();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(connections.serve(theirs).is_err());
}

/// A TLS-terminating forwarder (Python's `ssl`, a real TLS server) in front of `upstream_port`,
/// with a certificate for IP 127.0.0.1 from a CA made here by `openssl`. Returns its port, the
/// CA's PEM, and the child to kill.
fn tls_front(dir: &std::path::Path, upstream_port: u16) -> (u16, Vec<u8>, std::process::Child) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=berth-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "srv.key",
        "-out",
        "srv.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    std::fs::write(
        dir.join("front.py"),
        r#"import socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[2], sys.argv[3])
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(16)
print(ls.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except Exception: pass
    for s in (a, b):
        try: s.close()
        except Exception: pass
def serve(c):
    try: t = ctx.wrap_socket(c, server_side=True)
    except Exception:
        c.close(); return
    u = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    threading.Thread(target=pipe, args=(t, u), daemon=True).start()
    pipe(u, t)
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#,
    )
    .unwrap();
    let mut child = Command::new("python3")
        .arg(dir.join("front.py"))
        .arg(upstream_port.to_string())
        .arg(dir.join("srv.pem"))
        .arg(dir.join("srv.key"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    (port, std::fs::read(dir.join("ca.pem")).unwrap(), child)
}

/// An https upstream: reached over TLS when its certificate chains to a trusted root (here a
/// private CA given with `trust_pem`), refused — 502, nothing sent — when it does not.
#[tokio::test]
async fn https_upstreams_are_verified_against_trusted_roots() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = scripted(None);
    let credential = upstream.admit("upstream", dir.path().join("upstream.jsonl"));
    let upstream_running = upstream.listen(0).await.unwrap();
    let (port, ca, mut front) = tls_front(dir.path(), upstream_running.addr().port());
    let origin = format!("https://127.0.0.1:{port}");

    let trusted = Proxy::new(&origin, credential.expose().to_owned())
        .unwrap()
        .trust_pem(&ca)
        .unwrap();
    let untrusted = Proxy::new(&origin, credential.expose().to_owned()).unwrap();
    let mut answers = Vec::new();
    for proxy in [trusted, untrusted] {
        let gateway = Gateway::new(GatewayConfig {
            upstream: Upstream::Proxy(Arc::new(proxy)),
            prices: None,
        });
        let token = gateway.admit("m1:t1:a1", dir.path().join("proxy.jsonl"));
        let running = gateway.listen(0).await.unwrap();
        let auth = format!("Bearer {}", token.expose());
        let url = format!("{}/v1/chat/completions", running.base_url());
        answers.push(post(&url, &[("authorization", &auth)], &chat_request(0, false)).await);
    }
    let _ = front.kill();
    let _ = front.wait();
    let (status, body) = &answers[0];
    assert_eq!(*status, 200, "{body}");
    assert!(body.contains("printf hi > hello.txt"), "{body}");
    let (status, body) = &answers[1];
    assert_eq!(*status, 502, "{body}");
    assert!(body.contains("TLS"), "{body}");
    assert!(Proxy::new(&origin, "k".into())
        .unwrap()
        .trust_pem(b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
        .is_err());
}

/// A raw request to the gateway: head (with `token`) and `body`.
fn raw_request(token: &str, content_length: usize) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {content_length}\r\n\r\n"
    )
    .into_bytes()
}

/// The status of the answer read from `stream` (None: nothing within its read timeout).
fn status_of(stream: &mut std::net::TcpStream) -> Option<u16> {
    use std::io::Read;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(2).any(|w| w == b"\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
}

/// A process in a sandbox holds its attempt's token and can open connections to the gateway:
/// it cannot make the host keep more than 64 of them, nor hold more than 256 MiB of request
/// bodies (before: 3,000 half-sent heads were all kept, 40 connections held 1.3 GB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_sandbox_can_make_the_gateway_hold_is_bounded() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let gateway = scripted(None);
    let token = gateway.admit("a", dir.path().join("journal.jsonl"));
    let running = gateway.listen(0).await.unwrap();
    let addr = running.addr();
    let token = token.expose().to_owned();
    tokio::task::spawn_blocking(move || {
        let small = serde_json::to_vec(&chat_request(0, false)).unwrap();
        let ask = |stream: &mut TcpStream| {
            stream.write_all(&raw_request(&token, small.len())).unwrap();
            stream.write_all(&small).unwrap();
        };
        // 1. Connections: 64 that never finish their head; the 65th waits until one ends.
        let mut idle: Vec<TcpStream> = (0..64)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
                    .unwrap();
                s
            })
            .collect();
        let mut waiting = TcpStream::connect(addr).unwrap();
        ask(&mut waiting);
        waiting
            .set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        assert_eq!(
            status_of(&mut waiting),
            None,
            "a 65th connection was served"
        );
        idle.pop();
        waiting
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(status_of(&mut waiting), Some(200), "served once one ended");
        drop(idle);
        drop(waiting);

        // 2. Bodies: eight nearly whole 32 MiB bodies fill the 256 MiB the gateway holds.
        const BODY: usize = 32 << 20;
        let chunk = vec![b'x'; 1 << 20];
        let mut big: Vec<TcpStream> = (0..8)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(&raw_request(&token, BODY)).unwrap();
                for _ in 0..31 {
                    s.write_all(&chunk).unwrap();
                }
                s.write_all(&chunk[..chunk.len() - 1]).unwrap();
                s
            })
            .collect();
        // Once they have all arrived, a small request is refused with 503 (retryable).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            ask(&mut s);
            match status_of(&mut s) {
                Some(503) => break,
                Some(200) => assert!(Instant::now() < deadline, "never refused"),
                other => panic!("{other:?}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // One body completes (it is not JSON: 400) and gives its share back.
        big[0].write_all(b"x").unwrap();
        big[0]
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(status_of(&mut big[0]), Some(400));
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        ask(&mut s);
        assert_eq!(status_of(&mut s), Some(200), "the share was not given back");
        big.clear();
    })
    .await
    .unwrap();
}
