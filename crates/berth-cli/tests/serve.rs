//! `berth serve` from outside, over real HTTP on loopback: tokens and scopes, owner isolation,
//! the audit log, a canary secret that must never come back, a mission's events over SSE
//! resumed from an event id, the published OpenAPI description, SIGKILL and restart with
//! nothing lost, and a short concurrent load with no error and no leaked sandbox.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
mod missions_support;

use common::*;

fn token(home: &Home, owner: &str, scope: &str) -> (String, String) {
    // What the token makes is swept when the test ends, pass or fail.
    home.owners.borrow_mut().insert(owner.to_owned());
    let (code, doc) = home.json(&["token", "create", "--owner", owner, "--scope", scope]);
    assert_eq!(code, 0, "{doc}");
    (
        doc["token"].as_str().unwrap().to_owned(),
        doc["id"].as_str().unwrap().to_owned(),
    )
}

/// One HTTP/1.1 request (connection closed after): status and body text.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status: u16 = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn call(addr: &str, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let (status, text) = http(addr, method, path, Some(token), body.as_ref());
    let doc = json_of(&text);
    assert_eq!(doc["schema"], "berth.cli/v1", "{doc}");
    (status, doc)
}

/// The statuses `owner`'s audit log holds for `route`, in order (read with an admin token).
fn audited(home: &Home, addr: &str, owner: &str, route: &str) -> Vec<u64> {
    let (admin, _) = token(home, owner, "admin");
    let (_, audit) = call(addr, "GET", "/v1/audit", &admin, None);
    audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["route"] == route)
        .map(|e| e["status"].as_u64().unwrap())
        .collect()
}

fn create(addr: &str, token: &str) -> String {
    let (status, doc) = call(addr, "POST", "/v1/sandboxes", token, Some(json!({})));
    assert_eq!(status, 200, "{doc}");
    doc["sandbox"]["berth_id"].as_str().unwrap().to_owned()
}

#[test]
fn tokens_scopes_owners_and_the_audit_log() {
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let (alice_read, _) = token(&home, "alice", "read");
    let (alice_admin, _) = token(&home, "alice", "admin");
    let (bob, bob_id) = token(&home, "bob", "exec");
    // A name or owner with a control character (a terminal escape) is refused: `token list`
    // would send it to a terminal. Nothing is created.
    for (owner, name) in [
        ("carol", "ci\u{1b}]0;pwned\u{7}"),
        ("carol\u{1b}[31m", "ci"),
    ] {
        let (code, doc) = home.json(&[
            "token", "create", "--owner", owner, "--scope", "read", "--name", name,
        ]);
        assert_eq!(code, 5, "{doc}");
        assert_eq!(doc["error"]["kind"], "invalid_request", "{doc}");
    }
    let (_, doc) = home.json(&["token", "list"]);
    assert_eq!(doc["tokens"].as_array().unwrap().len(), 4, "{doc}");
    let server = serve(&home);
    let addr = server.addr.as_str();

    // No token, a malformed one, an unknown one: 401.
    let (status, text) = http(addr, "GET", "/v1/sandboxes", None, None);
    assert_eq!(status, 401, "{text}");
    assert_eq!(json_of(&text)["error"]["kind"], "unauthenticated");
    assert_eq!(
        http(addr, "GET", "/v1/sandboxes", Some("nonsense"), None).0,
        401
    );
    let forged = format!("berth_{}", "0".repeat(64));
    assert_eq!(
        http(addr, "GET", "/v1/sandboxes", Some(&forged), None).0,
        401
    );

    // Alice creates; her read token lists it but may not create, exec or destroy (403).
    let id = create(addr, &alice);
    let (status, doc) = call(addr, "GET", "/v1/sandboxes", &alice_read, None);
    assert_eq!(status, 200, "{doc}");
    assert!(doc.to_string().contains(&id), "{doc}");
    for (method, path, body) in [
        ("POST", "/v1/sandboxes".to_owned(), Some(json!({}))),
        (
            "POST",
            format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"argv": ["true"]})),
        ),
        ("DELETE", format!("/v1/sandboxes/{id}"), None),
    ] {
        let (status, doc) = call(addr, method, &path, &alice_read, body);
        assert_eq!(status, 403, "{method} {path}: {doc}");
        assert_eq!(doc["error"]["kind"], "forbidden");
    }
    // The audit log is admin's.
    assert_eq!(call(addr, "GET", "/v1/audit", &alice, None).0, 403);

    // Bob sees nothing of Alice's: her id answers 404 everywhere, like one that never existed.
    let (_, doc) = call(addr, "GET", "/v1/sandboxes", &bob, None);
    assert!(!doc.to_string().contains(&id), "{doc}");
    for (method, path, body) in [
        ("GET", format!("/v1/sandboxes/{id}"), None),
        (
            "POST",
            format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"argv": ["true"]})),
        ),
        ("DELETE", format!("/v1/sandboxes/{id}"), None),
        ("GET", "/v1/sandboxes/bx-000000000000".to_owned(), None),
    ] {
        let (status, doc) = call(addr, method, &path, &bob, body);
        assert_eq!(status, 404, "{method} {path}: {doc}");
        assert!(
            !doc.to_string().contains("alice"),
            "the other owner leaked: {doc}"
        );
    }
    // Hostile input is a clean 400.
    let (status, doc) = call(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &alice,
        Some(json!({"argv": ["true"], "env": {"A=B": "x"}})),
    );
    assert_eq!(status, 400, "{doc}");
    // JSON can carry a NUL no process argument can: refused, not run with a placeholder.
    for body in [
        json!({"argv": ["sh", "-c", "echo \"$0\"", "x\u{0}y"]}),
        json!({"shell": "echo x\u{0}y"}),
    ] {
        let (status, doc) = call(
            addr,
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            &alice,
            Some(body),
        );
        assert_eq!(status, 400, "{doc}");
        assert_eq!(doc["error"]["kind"], "invalid_request", "{doc}");
        assert!(
            doc["error"]["message"].as_str().unwrap().contains("NUL"),
            "{doc}"
        );
    }
    let (status, doc) = call(
        addr,
        "POST",
        "/v1/sandboxes",
        &alice,
        Some(json!({"surprise": 1})),
    );
    assert_eq!(status, 400, "{doc}");
    let (status, _) = http(
        addr,
        "POST",
        "/v1/sandboxes",
        Some(&alice),
        Some(&json!("x".repeat(2 << 20))),
    );
    assert_eq!(status, 413, "an oversized body is refused");

    // Alice's exec and destroy work; the exit code is the command's.
    let (status, doc) = call(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &alice,
        Some(json!({"argv": ["sh", "-c", "echo out; exit 3"]})),
    );
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["exit_code"], 3, "{doc}");
    assert_eq!(doc["stdout"], "out\n", "{doc}");
    let (status, doc) = call(addr, "DELETE", &format!("/v1/sandboxes/{id}"), &alice, None);
    assert_eq!(status, 200, "{doc}");

    // A revoked token answers 401 at once.
    let (code, doc) = home.json(&["token", "revoke", &bob_id]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(call(addr, "GET", "/v1/sandboxes", &bob, None).0, 401);

    // Every mutating request of Alice's is in her audit log (forbidden ones too); reads are not.
    let (status, doc) = call(addr, "GET", "/v1/audit", &alice_admin, None);
    assert_eq!(status, 200, "{doc}");
    let entries = doc["entries"].as_array().unwrap();
    let seen: Vec<(String, String, u64)> = entries
        .iter()
        .map(|e| {
            (
                e["method"].as_str().unwrap().to_owned(),
                e["route"].as_str().unwrap().to_owned(),
                e["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        seen.contains(&("POST".into(), "/v1/sandboxes".into(), 200)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&("POST".into(), "/v1/sandboxes/{id}/exec".into(), 200)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&("DELETE".into(), "/v1/sandboxes/{id}".into(), 200)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&("DELETE".into(), "/v1/sandboxes/{id}".into(), 403)),
        "{seen:?}"
    );
    assert!(seen.iter().all(|(m, _, _)| m != "GET"), "{seen:?}");
    assert!(entries.iter().all(|e| e["owner"] == "alice"), "{doc}");
    // Bob's 404s are his own, not in Alice's log.
    assert!(entries.iter().all(|e| e["status"] != 404), "{doc}");
}

#[test]
fn a_canary_secret_never_comes_back() {
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "admin");
    let mut server = serve(&home);
    let addr = server.addr.clone();
    let id = create(&addr, &alice);
    let mut answers = String::new();
    // The secret goes in; the command proves it arrived without printing it.
    let (status, doc) = call(
        &addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &alice,
        Some(
            json!({"argv": ["sh", "-c", "test \"$TOKEN\" = \"$EXPECTED\" && echo matched"],
                    "env": {"TOKEN": CANARY, "EXPECTED": CANARY}}),
        ),
    );
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["stdout"], "matched\n", "{doc}");
    answers.push_str(&doc.to_string());
    // Failing requests carrying it too.
    for body in [
        json!({"argv": ["no-such-command-berth"], "env": {"TOKEN": CANARY}}),
        json!({"argv": ["true"], "env": {"TOKEN": CANARY}, "timeout": "soon"}),
        json!({"argv": ["true"], "env": {"BAD NAME": CANARY}}),
    ] {
        let (_, text) = http(
            &addr,
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&alice),
            Some(&body),
        );
        answers.push_str(&text);
    }
    for path in [
        "/v1/sandboxes",
        "/v1/ledger",
        "/v1/audit",
        &format!("/v1/sandboxes/{id}"),
    ] {
        answers.push_str(&http(&addr, "GET", path, Some(&alice), None).1);
    }
    let (status, _) = call(
        &addr,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        &alice,
        None,
    );
    assert_eq!(status, 200);
    assert!(!answers.contains(CANARY), "a response carried the canary");
    let _ = server.child.kill();
    let mut logs = String::new();
    server
        .child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    assert!(
        !logs.contains(CANARY),
        "the server's log carried the canary"
    );
    home.assert_no_canary_persisted();
}

#[test]
fn the_served_openapi_is_the_published_one() {
    let home = Home::new();
    let server = serve(&home);
    let (status, text) = http(&server.addr, "GET", "/v1/openapi.json", None, None);
    assert_eq!(status, 200);
    let published = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/openapi.json"),
    )
    .unwrap();
    assert_eq!(json_of(&text), json_of(&published));
}

/// A stream asked to resume from something that is not an event id answers 400 with an error
/// document, never the stream replayed from its start (the client would see events twice).
fn assert_bad_resume_points_refused(addr: &str, path: &str, token: &str) {
    for bad in ["abc", "-1", "99999999999999999999999", "1, 2"] {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nLast-Event-ID: {bad}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 400"), "{bad}: {response}");
        let body = response.split_once("\r\n\r\n").unwrap().1;
        assert_eq!(json_of(body)["error"]["kind"], "invalid_request", "{body}");
    }
}

/// Reads server-sent events until `end`: (id, event name) pairs.
fn sse(addr: &str, path: &str, token: &str, last_event_id: Option<&str>) -> Vec<(String, String)> {
    sse_data(addr, path, token, last_event_id, "end")
        .into_iter()
        .map(|(id, name, _)| (id, name))
        .collect()
}

#[test]
fn mission_events_stream_and_resume_from_an_event_id() {
    let home = Home::new();
    let repo = home.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("README"), "x\n").unwrap();
    let file = home.path().join("m.toml");
    std::fs::write(
        &file,
        r#"schema_version = 1
name = "served"
[repository]
path = "repo"
base = "snapshot"
[sandbox]
provider = "host"
[harness]
kind = "script"
command = "echo done > out.txt"
[[tasks]]
id = "one"
instructions = "write out.txt"
max_attempts = 1
agent_timeout = "30s"
[tasks.validator]
command = "test -f out.txt"
timeout = "30s"
evidence = ["out.txt"]
"#,
    )
    .unwrap();
    let (code, doc) = home.json_as("alice", &["mission", "run", &file.to_string_lossy()]);
    assert_eq!(code, 0, "{doc}");
    let mission = doc["mission"]["id"]
        .as_str()
        .or(doc["id"].as_str())
        .unwrap_or_else(|| panic!("no mission id in {doc}"))
        .to_owned();
    let (alice, _) = token(&home, "alice", "read");
    let (bob, _) = token(&home, "bob", "read");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let path = format!("/v1/missions/{mission}/events");
    let all = sse(addr, &path, &alice, None);
    assert!(all.len() >= 3, "{all:?}");
    assert_eq!(all.last().unwrap().1, "end");
    let ids: Vec<i64> = all
        .iter()
        .filter(|(_, name)| name == "mission")
        .map(|(id, _)| id.parse().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "ids not consecutive: {ids:?}"
    );
    // Reconnecting with Last-Event-ID gets exactly what came after it.
    let middle = ids[ids.len() / 2];
    let resumed = sse(addr, &path, &alice, Some(&middle.to_string()));
    let resumed_ids: Vec<i64> = resumed
        .iter()
        .filter(|(_, name)| name == "mission")
        .map(|(id, _)| id.parse().unwrap())
        .collect();
    assert_eq!(
        resumed_ids,
        ids.iter()
            .copied()
            .filter(|i| *i > middle)
            .collect::<Vec<_>>()
    );
    assert_bad_resume_points_refused(addr, &path, &alice);
    let (status, doc) = call(addr, "GET", &format!("{path}?after=abc"), &alice, None);
    assert_eq!(status, 400, "{doc}");
    assert_eq!(doc["error"]["kind"], "invalid_request", "{doc}");
    // The mission is alice's: bob gets 404 for it and its events; alice reads its status.
    assert_eq!(http(addr, "GET", &path, Some(&bob), None).0, 404);
    assert_eq!(
        call(addr, "GET", &format!("/v1/missions/{mission}"), &bob, None).0,
        404
    );
    let (status, doc) = call(
        addr,
        "GET",
        &format!("/v1/missions/{mission}"),
        &alice,
        None,
    );
    assert_eq!(status, 200, "{doc}");
    let (status, doc) = call(addr, "GET", "/v1/missions", &alice, None);
    assert_eq!(status, 200, "{doc}");
    assert!(doc.to_string().contains(&mission), "{doc}");
    // A mission that succeeded is not cancelled: 409, with the way to see how it ended.
    let (alice_exec, _) = token(&home, "alice", "exec");
    let cancel = format!("/v1/missions/{mission}/cancel");
    let (status, doc) = call(addr, "POST", &cancel, &alice_exec, Some(json!({})));
    assert_eq!(status, 409, "{doc}");
    assert_eq!(doc["error"]["kind"], "conflict", "{doc}");
}

#[test]
fn the_server_survives_sigkill_and_restart_with_nothing_lost() {
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let mut first = serve(&home);
    let ids: Vec<String> = (0..3).map(|_| create(&first.addr, &alice)).collect();
    signal(&first.child, nix::sys::signal::Signal::SIGKILL);
    let _ = first.child.wait();
    let second = serve(&home);
    let (status, doc) = call(&second.addr, "GET", "/v1/sandboxes", &alice, None);
    assert_eq!(status, 200, "{doc}");
    for id in &ids {
        assert!(doc.to_string().contains(id.as_str()), "{id} lost: {doc}");
        let (status, doc) = call(
            &second.addr,
            "DELETE",
            &format!("/v1/sandboxes/{id}"),
            &alice,
            None,
        );
        assert_eq!(status, 200, "{doc}");
    }
}

/// A bounded load on loopback: clients listing and creating-then-destroying host sandboxes at
/// once. No request fails and nothing is left behind. (`berth bench serve` measures the same
/// at full size and reports percentiles; this only proves correctness under concurrency.)
#[test]
fn concurrent_clients_leave_no_error_and_no_sandbox() {
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let server = serve(&home);
    let until = Instant::now() + Duration::from_secs(5);
    let workers: Vec<_> = (0..10)
        .map(|n| {
            let (addr, token) = (server.addr.clone(), alice.clone());
            std::thread::spawn(move || {
                let mut done = 0;
                while Instant::now() < until {
                    if n % 2 == 0 {
                        let (status, doc) = call(&addr, "GET", "/v1/sandboxes", &token, None);
                        assert_eq!(status, 200, "{doc}");
                    } else {
                        let id = create(&addr, &token);
                        let (status, doc) = call(
                            &addr,
                            "DELETE",
                            &format!("/v1/sandboxes/{id}"),
                            &token,
                            None,
                        );
                        assert_eq!(status, 200, "{doc}");
                    }
                    done += 1;
                }
                done
            })
        })
        .collect();
    let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(total > 10, "only {total} requests in 5 s");
    let (_, doc) = call(&server.addr, "GET", "/v1/sandboxes", &alice, None);
    assert_eq!(doc["sandboxes"].as_array().map(Vec::len), Some(0), "{doc}");
    let left = std::fs::read_dir(home.path().join("state/host/sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "sandbox directories left behind");
}

/// Server-sent events with their data: (id, event, data).
fn sse_data(
    addr: &str,
    path: &str,
    token: &str,
    last_event_id: Option<&str>,
    until: &str,
) -> Vec<(String, String, String)> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n"
    );
    if let Some(id) = last_event_id {
        request.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let reader = BufReader::new(stream);
    let (mut events, mut id, mut name, mut data) =
        (Vec::new(), String::new(), String::new(), String::new());
    for line in reader.lines() {
        let line = line.unwrap();
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        } else if line.is_empty() && !name.is_empty() {
            let done = name == until;
            events.push((
                std::mem::take(&mut id),
                std::mem::take(&mut name),
                std::mem::take(&mut data),
            ));
            if done {
                break;
            }
        }
    }
    events
}

fn unbase64(text: &str) -> Vec<u8> {
    let table = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = text.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|c| u32::from(table(*c))).collect();
        let n = v.iter().fold(0u32, |acc, x| (acc << 6) | x) << (6 * (4 - v.len()));
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..v.len() - 1]);
    }
    out
}

#[test]
fn exec_output_streams_over_sse_and_resumes_from_an_event_id() {
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let (bob, _) = token(&home, "bob", "exec");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let id = create(addr, &alice);
    let (status, doc) = call(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/execs"),
        &alice,
        Some(json!({
            "argv": ["sh", "-c", "echo one; sleep 0.5; printf '\\000\\377'; echo two >&2; exit 4"],
            "env": {"TOKEN": CANARY},
        })),
    );
    assert_eq!(status, 202, "{doc}");
    let events_path = doc["events"].as_str().unwrap().to_owned();
    let job = doc["job"].as_str().unwrap().to_owned();
    let all = sse_data(addr, &events_path, &alice, None, "exit");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for (_, name, data) in &all {
        match name.as_str() {
            "stdout" => stdout.extend(unbase64(data)),
            "stderr" => stderr.extend(unbase64(data)),
            _ => {}
        }
    }
    assert_eq!(stdout, b"one\n\x00\xff", "{all:?}");
    assert_eq!(stderr, b"two\n", "{all:?}");
    let (last_id, last_name, last_data) = all.last().unwrap();
    assert_eq!(last_name, "exit");
    let exit = json_of(last_data);
    assert_eq!(exit["exit"]["exit_code"], 4, "{exit}");
    let ids: Vec<usize> = all.iter().map(|(id, _, _)| id.parse().unwrap()).collect();
    assert_eq!(ids, (1..=ids.len()).collect::<Vec<_>>());
    // Resumed after the first event: exactly the rest.
    let rest = sse_data(addr, &events_path, &alice, Some("1"), "exit");
    assert_eq!(rest.len(), all.len() - 1, "{rest:?}");
    assert_eq!(rest.first().unwrap().0, "2");
    assert_eq!(&rest.last().unwrap().0, last_id);
    assert_bad_resume_points_refused(addr, &events_path, &alice);
    // Another owner: 404, for the job and for the sandbox.
    let other = format!("/v1/sandboxes/{id}/execs/{job}/events");
    assert_eq!(http(addr, "GET", &other, Some(&bob), None).0, 404);
    assert_eq!(
        call(
            addr,
            "POST",
            &format!("/v1/sandboxes/{id}/execs"),
            &bob,
            Some(json!({"argv": ["true"]}))
        )
        .0,
        404
    );
    assert!(!format!("{all:?}").contains(CANARY));
    let (status, _) = call(addr, "DELETE", &format!("/v1/sandboxes/{id}"), &alice, None);
    assert_eq!(status, 200);
}

/// Revoking a token ends the event streams it already has open (within the recheck second),
/// with an `error` event saying why: a revoked token reads nothing more.
#[test]
fn a_revoked_tokens_open_event_stream_ends() {
    let home = Home::new();
    let (alice, alice_id) = token(&home, "alice", "exec");
    let (alice_too, _) = token(&home, "alice", "exec");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let id = create(addr, &alice);
    let (status, doc) = call(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/execs"),
        &alice,
        Some(
            json!({"argv": ["sh", "-c", "echo first; for i in $(seq 1 40); do sleep 0.5; echo more; done"]}),
        ),
    );
    assert_eq!(status, 202, "{doc}");
    let path = doc["events"].as_str().unwrap().to_owned();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {alice}\r\n\r\n"
    )
    .unwrap();
    let mut lines = BufReader::new(stream).lines().map_while(Result::ok);
    assert!(
        lines.by_ref().any(|line| line == "event: stdout"),
        "the stream never started"
    );
    let (code, doc) = home.json(&["token", "revoke", &alice_id]);
    assert_eq!(code, 0, "{doc}");
    let revoked = Instant::now();
    // Up to the error event (the connection itself may stay open for another request).
    let mut rest = Vec::new();
    for line in lines.by_ref() {
        let said = line == "data: the token was revoked";
        rest.push(line);
        if said {
            break;
        }
    }
    let ended = revoked.elapsed();
    let text = rest.join("\n");
    assert!(
        text.ends_with("event: error\ndata: the token was revoked"),
        "{text}"
    );
    assert!(ended < Duration::from_secs(10), "ended after {ended:?}");
    // Then the chunked body's end: nothing more on this stream.
    let tail: Vec<String> = lines.take_while(|line| line != "0").collect();
    assert!(
        tail.iter().all(|line| line.is_empty()),
        "after the error: {tail:?}"
    );
    // The other token of the same owner still reads the job.
    let all = sse_data(addr, &path, &alice_too, Some("1"), "stdout");
    assert_eq!(all.len(), 1, "{all:?}");
    let (status, _) = call(
        addr,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        &alice_too,
        None,
    );
    assert_eq!(status, 200);
}

/// A client that opens a connection and never finishes its request (slowloris) is cut off
/// after the request deadline (10 s), while a well-formed request on another connection is
/// answered meanwhile.
#[test]
fn a_request_never_finished_is_cut_off() {
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "read");
    let server = serve(&home);
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.write_all(b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let started = Instant::now();
    let (status, doc) = call(&server.addr, "GET", "/v1/sandboxes", &alice, None);
    assert_eq!(status, 200, "{doc}");
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    // Closed by the server (EOF or reset), not by our read timeout.
    match slow.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(8) && waited < Duration::from_secs(25),
        "closed after {waited:?}"
    );
}

/// `POST /v1/missions/{id}/cancel` is `berth mission cancel` behind a token: scope `exec`,
/// the owner's missions only, 409 once the mission has finished.
#[test]
fn a_mission_is_cancelled_over_the_api() {
    let home = Home::new();
    let marks = home.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let agent = format!("echo $$ > {}/agent; exec sleep 300\n", marks.display());
    let file = missions_support::write_mission(home.path(), &agent, "true", "30s", "\"README\"", 1);
    let mission = mission_left_running(&home, "alice", &file, &marks);
    let (reader, _) = token(&home, "alice", "read");
    let (alice, _) = token(&home, "alice", "exec");
    let (bob, _) = token(&home, "bob", "exec");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let path = format!("/v1/missions/{mission}/cancel");
    let reason = serde_json::json!({ "reason": "over the API" });
    assert_eq!(
        call(addr, "POST", &path, &reader, Some(reason.clone())).0,
        403
    );
    assert_eq!(call(addr, "POST", &path, &bob, Some(reason.clone())).0, 404);
    let (status, doc) = call(
        addr,
        "POST",
        &path,
        &alice,
        Some(serde_json::json!({ "why": 1 })),
    );
    assert_eq!(status, 400, "{doc}");
    let (status, doc) = call(addr, "POST", &path, &alice, Some(reason));
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["state"]["state"], "cancelled", "{doc}");
    assert_eq!(doc["state"]["reason"], "over the API", "{doc}");
    assert_eq!(doc["sandboxes"]["verified_gone"], 1, "{doc}");
    let (_, ledger) = home.json_as("alice", &["ledger", "list"]);
    assert_eq!(ledger["entries"].as_array().unwrap().len(), 0, "{ledger}");
    // Every cancel asked for is audited, the forbidden and refused ones too.
    assert_eq!(
        audited(&home, addr, "alice", "/v1/missions/{id}/cancel"),
        vec![403, 400, 200]
    );

    // Cancelling it again changes nothing (and finishes a teardown a crash cut short).
    let (status, doc) = call(addr, "POST", &path, &alice, Some(serde_json::json!({})));
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["state"]["reason"], "over the API", "{doc}");
}

/// Files in and out of a sandbox over the API: binary-safe, scope `exec`, the owner's sandboxes
/// only, the file API's path rules (`..`, absolute, a symlink leading out: 400), bounded (8 MiB
/// a file; the route takes bodies past the API's usual 1 MiB for it).
#[test]
fn files_go_in_and_out_over_the_api() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let (reader, _) = token(&home, "alice", "read");
    let (bob, _) = token(&home, "bob", "exec");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let id = create(addr, &alice);
    let files = format!("/v1/sandboxes/{id}/files");
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let put = |token: &str, path: &str, bytes: &[u8]| {
        call(
            addr,
            "PUT",
            &files,
            token,
            Some(json!({ "path": path, "content_base64": b64.encode(bytes) })),
        )
    };
    let get =
        |token: &str, path: &str| call(addr, "GET", &format!("{files}?path={path}"), token, None);

    let (status, doc) = put(&alice, "dir/sub/blob.bin", &every_byte);
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["bytes"], 4096, "{doc}");
    let (status, doc) = get(&alice, "dir/sub/blob.bin");
    assert_eq!(status, 200, "{doc}");
    let back = b64.decode(doc["content_base64"].as_str().unwrap()).unwrap();
    assert_eq!(back, every_byte);

    // Scope and owner.
    assert_eq!(get(&reader, "dir/sub/blob.bin").0, 403);
    assert_eq!(put(&reader, "x", b"x").0, 403);
    assert_eq!(get(&bob, "dir/sub/blob.bin").0, 404);
    assert_eq!(put(&bob, "x", b"x").0, 404);

    // Hostile paths, a missing file, a malformed request.
    for path in ["../../etc/passwd", "/etc/passwd", "dir/../../x"] {
        let (status, doc) = get(&alice, path);
        assert_eq!(status, 400, "{path}: {doc}");
        let (status, doc) = put(&alice, path, b"x");
        assert_eq!(status, 400, "{path}: {doc}");
    }
    let link = call(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &alice,
        Some(json!({ "shell": "ln -s /etc/passwd out && head -c 9437184 /dev/zero > big" })),
    );
    assert_eq!(link.0, 200, "{}", link.1);
    assert_eq!(
        get(&alice, "out").0,
        400,
        "a symlink leading out is followed"
    );
    let (status, doc) = get(&alice, "nothing-here");
    assert_eq!(status, 404, "{doc}");
    // A NUL (which a query and JSON can carry and no path can), an empty path, a directory.
    for path in ["a%00b", "", "dir"] {
        let (status, doc) = get(&alice, path);
        assert_eq!(status, 400, "{path}: {doc}");
    }
    for path in ["a\u{0}b", "", "dir"] {
        let (status, doc) = put(&alice, path, b"x");
        assert_eq!(status, 400, "{path:?}: {doc}");
    }
    let (status, doc) = get(&alice, "dir/sub/blob.bin");
    assert_eq!(status, 200, "the refused writes changed nothing: {doc}");
    assert_eq!(doc["bytes"], 4096, "{doc}");
    let (status, doc) = call(addr, "GET", &files, &alice, None);
    assert_eq!(status, 400, "no path: {doc}");
    let (status, doc) = call(
        addr,
        "PUT",
        &files,
        &alice,
        Some(json!({ "path": "x", "content_base64": "not base64!" })),
    );
    assert_eq!(status, 400, "{doc}");

    // The directory as `berth ls` lists it: sorted, the link shown and not followed.
    let (status, doc) = call(
        addr,
        "GET",
        &format!("/v1/sandboxes/{id}/ls?path=."),
        &alice,
        None,
    );
    assert_eq!(status, 200, "{doc}");
    let names: Vec<(&str, &str)> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [("big", "file"), ("dir", "dir"), ("out", "symlink")],
        "{doc}"
    );
    let (status, doc) = call(
        addr,
        "GET",
        &format!("/v1/sandboxes/{id}/ls?path=out"),
        &alice,
        None,
    );
    assert_eq!(status, 400, "a symlink is not listed through: {doc}");
    assert_eq!(
        call(
            addr,
            "GET",
            &format!("/v1/sandboxes/{id}/ls?path=.."),
            &alice,
            None
        )
        .0,
        400
    );
    assert_eq!(
        call(
            addr,
            "GET",
            &format!("/v1/sandboxes/{id}/ls?path=."),
            &reader,
            None
        )
        .0,
        403
    );
    assert_eq!(
        call(
            addr,
            "GET",
            &format!("/v1/sandboxes/{id}/ls?path=."),
            &bob,
            None
        )
        .0,
        404
    );

    // Past the API's usual 1 MiB body; and past its 8 MiB a file, either way.
    let two_mib = vec![7u8; 2 << 20];
    let (status, doc) = put(&alice, "two", &two_mib);
    assert_eq!(status, 200, "{doc}");
    assert_eq!(
        b64.decode(get(&alice, "two").1["content_base64"].as_str().unwrap())
            .unwrap(),
        two_mib
    );
    let (status, doc) = get(&alice, "big");
    assert_eq!(status, 400, "{doc}");
    assert!(
        doc["error"]["message"].as_str().unwrap().contains("8 MiB"),
        "{doc}"
    );
    let (status, doc) = put(&alice, "big2", &vec![0u8; 9 << 20]);
    assert_eq!(status, 413, "{doc}");
    assert_eq!(
        call(addr, "DELETE", &format!("/v1/sandboxes/{id}"), &alice, None).0,
        200
    );
}

/// `POST /v1/sandboxes/{id}/move` is `berth move` behind a token: scope `exec`, the owner's
/// sandboxes only, a body checked before anything is made, every request audited.
#[test]
fn a_sandbox_is_moved_over_the_api() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let (reader, _) = token(&home, "alice", "read");
    let (bob, _) = token(&home, "bob", "exec");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let source = create(addr, &alice);
    let (status, doc) = call(
        addr,
        "PUT",
        &format!("/v1/sandboxes/{source}/files"),
        &alice,
        Some(json!({ "path": "work/notes", "content_base64": b64.encode(b"moved over http\n") })),
    );
    assert_eq!(status, 200, "{doc}");
    let path = format!("/v1/sandboxes/{source}/move");
    let to_host = json!({ "to": "host" });
    assert_eq!(
        call(addr, "POST", &path, &reader, Some(to_host.clone())).0,
        403
    );
    assert_eq!(
        call(addr, "POST", &path, &bob, Some(to_host.clone())).0,
        404
    );
    for bad in [
        json!({ "to": "host", "why": 1 }),
        json!({}),
        json!({ "to": "host", "network": "everywhere" }),
        json!({ "to": "host", "ttl": "forever" }),
    ] {
        let (status, doc) = call(addr, "POST", &path, &alice, Some(bad.clone()));
        assert_eq!(status, 400, "{bad}: {doc}");
    }
    let (_, ledger) = home.json_as("alice", &["ledger", "list"]);
    assert_eq!(ledger["entries"].as_array().unwrap().len(), 1, "{ledger}");

    let (status, doc) = call(addr, "POST", &path, &alice, Some(to_host.clone()));
    assert_eq!(status, 200, "{doc}");
    let target = doc["move"]["target"]["berth_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        doc["move"]["source_teardown"]["outcome"], "verified_gone",
        "{doc}"
    );
    let (status, read) = call(
        addr,
        "GET",
        &format!("/v1/sandboxes/{target}/files?path=work/notes"),
        &alice,
        None,
    );
    assert_eq!(status, 200, "{read}");
    assert_eq!(
        b64.decode(read["content_base64"].as_str().unwrap())
            .unwrap(),
        b"moved over http\n"
    );
    // Asked again: the source was already moved, to that target.
    let (status, again) = call(addr, "POST", &path, &alice, Some(to_host));
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        again["move"]["target"]["berth_id"],
        target.as_str(),
        "{again}"
    );
    assert_eq!(again["move"]["finished_earlier_move"], true, "{again}");

    // Each owner's audit log has its own requests, the refused ones too.
    let route = "/v1/sandboxes/{id}/move";
    assert_eq!(
        audited(&home, addr, "alice", route),
        vec![403, 400, 400, 400, 400, 200, 200]
    );
    assert_eq!(audited(&home, addr, "bob", route), vec![404]);
}

/// Checkpoints over the API: taken (scope `exec`), listed (`read`), restored on a provider and
/// deleted — the owner's only, bodies checked before anything is made, every change audited.
#[test]
fn checkpoints_are_taken_restored_and_deleted_over_the_api() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let (reader, _) = token(&home, "alice", "read");
    let (bob, _) = token(&home, "bob", "exec");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let source = create(addr, &alice);
    let (status, doc) = call(
        addr,
        "PUT",
        &format!("/v1/sandboxes/{source}/files"),
        &alice,
        Some(json!({ "path": "kept/notes", "content_base64": b64.encode(b"kept over http\n") })),
    );
    assert_eq!(status, 200, "{doc}");
    let take = format!("/v1/sandboxes/{source}/checkpoint");
    assert_eq!(call(addr, "POST", &take, &reader, Some(json!({}))).0, 403);
    assert_eq!(call(addr, "POST", &take, &bob, Some(json!({}))).0, 404);
    assert_eq!(
        call(addr, "POST", &take, &alice, Some(json!({ "keep": 1 }))).0,
        400
    );
    let (status, doc) = call(addr, "POST", &take, &alice, Some(json!({ "ttl": "1h" })));
    assert_eq!(status, 200, "{doc}");
    let id = doc["checkpoint"]["id"].as_str().unwrap().to_owned();
    assert!(doc["checkpoint"]["expires_at"].is_string(), "{doc}");

    let (status, listed) = call(addr, "GET", "/v1/checkpoints", &reader, None);
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["checkpoints"][0]["id"], id.as_str(), "{listed}");
    let (_, theirs) = call(addr, "GET", "/v1/checkpoints", &bob, None);
    assert_eq!(
        theirs["checkpoints"].as_array().unwrap().len(),
        0,
        "{theirs}"
    );

    let restore = format!("/v1/checkpoints/{id}/restore");
    assert_eq!(
        call(
            addr,
            "POST",
            &restore,
            &bob,
            Some(json!({ "provider": "host" }))
        )
        .0,
        404
    );
    assert_eq!(call(addr, "POST", &restore, &alice, Some(json!({}))).0, 400);
    assert_eq!(
        call(
            addr,
            "POST",
            &restore,
            &alice,
            Some(json!({ "provider": "nowhere" }))
        )
        .0,
        404
    );
    let (status, doc) = call(
        addr,
        "POST",
        &restore,
        &alice,
        Some(json!({ "provider": "host" })),
    );
    assert_eq!(status, 200, "{doc}");
    let sandbox = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let (status, read) = call(
        addr,
        "GET",
        &format!("/v1/sandboxes/{sandbox}/files?path=kept/notes"),
        &alice,
        None,
    );
    assert_eq!(status, 200, "{read}");
    assert_eq!(
        b64.decode(read["content_base64"].as_str().unwrap())
            .unwrap(),
        b"kept over http\n"
    );

    let delete = format!("/v1/checkpoints/{id}");
    assert_eq!(call(addr, "DELETE", &delete, &bob, None).0, 404);
    assert_eq!(
        call(
            addr,
            "DELETE",
            &format!("/v1/checkpoints/{source}"),
            &alice,
            None
        )
        .0,
        404
    );
    assert_eq!(call(addr, "DELETE", &delete, &alice, None).0, 200);
    assert_eq!(call(addr, "DELETE", &delete, &alice, None).0, 404);
    assert_eq!(
        audited(&home, addr, "alice", "/v1/sandboxes/{id}/checkpoint"),
        vec![403, 400, 200]
    );
    assert_eq!(
        audited(&home, addr, "alice", "/v1/checkpoints/{id}/restore"),
        vec![400, 404, 200]
    );
    assert_eq!(
        audited(&home, addr, "alice", "/v1/checkpoints/{id}"),
        vec![404, 200, 404]
    );
}

/// Agent sessions over the API: listed (`read`), the owner's only, and deleted (`exec`) — an
/// id that is no session's is not found, a second delete too, every change audited.
#[test]
fn agent_sessions_are_listed_and_deleted_over_the_api() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let (reader, _) = token(&home, "alice", "read");
    let (bob, _) = token(&home, "bob", "exec");
    let server = serve(&home);
    let addr = server.addr.as_str();
    let sandbox = create(addr, &alice);
    let model = home.path().join("model.toml");
    std::fs::write(
        &model,
        "schema_version = 1\n[[step]]\nshell = \"true\"\n[[step]]\ntext = \"done\"\n",
    )
    .unwrap();
    let out = home
        .command(
            "alice",
            &[
                "--json",
                "prompt",
                &sandbox,
                "--harness",
                "codex",
                "--script",
                model.to_str().unwrap(),
                "go",
            ],
        )
        .env("BERTH_AGENT_BIN_DIR", &bin)
        .output()
        .unwrap();
    let last: Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("null"),
    )
    .unwrap();
    let session = last["session"]
        .as_str()
        .unwrap_or_else(|| panic!("{last}"))
        .to_owned();

    let (status, listed) = call(addr, "GET", "/v1/sessions", &reader, None);
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["sessions"][0]["id"], session.as_str(), "{listed}");
    assert_eq!(listed["sessions"][0]["harness"], "codex", "{listed}");
    let (_, theirs) = call(addr, "GET", "/v1/sessions", &bob, None);
    assert_eq!(theirs["sessions"].as_array().unwrap().len(), 0, "{theirs}");

    let delete = format!("/v1/sessions/{session}");
    assert_eq!(call(addr, "DELETE", &delete, &reader, None).0, 403);
    assert_eq!(call(addr, "DELETE", &delete, &bob, None).0, 404);
    let (status, doc) = call(
        addr,
        "DELETE",
        &format!("/v1/sessions/{sandbox}"),
        &alice,
        None,
    );
    assert_eq!(status, 404, "a sandbox is no session: {doc}");
    assert_eq!(call(addr, "DELETE", &delete, &alice, None).0, 200);
    assert_eq!(call(addr, "DELETE", &delete, &alice, None).0, 404);
    let (_, listed) = call(addr, "GET", "/v1/sessions", &reader, None);
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 0, "{listed}");
    assert_eq!(
        audited(&home, addr, "alice", "/v1/sessions/{id}"),
        vec![403, 404, 200, 404]
    );
    // The sandbox was not touched by the delete aimed at it.
    let (status, _) = call(
        addr,
        "GET",
        &format!("/v1/sandboxes/{sandbox}"),
        &alice,
        None,
    );
    assert_eq!(status, 200);
}

/// A provider that isolates nothing (`host`) is not served by default: a command in one would
/// run as the server's own user, which reads the server's store (every owner's rows and token
/// hashes) — owner isolation would mean nothing. Creating one and running a command in one
/// answer 403 (audited), saying how to allow it; reading, files (beneath the workspace) and
/// destroying still work. Network `host` (the server's loopback services) is refused the same
/// way. With `--allow-unisolated` the command runs, and reaches the store.
#[test]
fn an_unisolated_provider_is_served_only_when_allowed() {
    use base64::Engine as _;
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let (code, made) = home.json_as("alice", &["create", "-p", "host"]);
    assert_eq!(code, 0, "{made}");
    let id = made["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let store = home.path().join("berth.db");
    let reads_store = json!({ "argv": ["test", "-r", store.to_str().unwrap()] });
    {
        let server = serve_with(&home, &[]);
        let addr = server.addr.as_str();
        for (path, body) in [
            ("/v1/sandboxes".to_owned(), json!({})),
            (
                "/v1/sandboxes".to_owned(),
                json!({ "provider": "docker", "fallback": ["host"] }),
            ),
            (format!("/v1/sandboxes/{id}/exec"), reads_store.clone()),
            (format!("/v1/sandboxes/{id}/execs"), reads_store.clone()),
            (format!("/v1/sandboxes/{id}/move"), json!({ "to": "host" })),
            (
                "/v1/sandboxes".to_owned(),
                json!({ "provider": "bwrap", "network": "host" }),
            ),
            (
                format!("/v1/sandboxes/{id}/prompt"),
                json!({ "harness": "codex", "instructions": "x",
                        "script": "schema_version = 1\n[[step]]\ntext = \"x\"\n" }),
            ),
        ] {
            let (status, doc) = call(addr, "POST", &path, &alice, Some(body));
            assert_eq!(status, 403, "{path}: {doc}");
            assert_eq!(doc["error"]["kind"], "forbidden", "{path}: {doc}");
            assert!(
                doc["error"]["hint"]
                    .as_str()
                    .unwrap()
                    .contains("--allow-unisolated"),
                "{path}: {doc}"
            );
        }
        assert_eq!(
            audited(&home, addr, "alice", "/v1/sandboxes/{id}/exec"),
            [403]
        );
        let (status, doc) = call(addr, "GET", &format!("/v1/sandboxes/{id}"), &alice, None);
        assert_eq!(status, 200, "{doc}");
        let note = json!({ "path": "note", "content_base64": base64::engine::general_purpose::STANDARD.encode(b"hi") });
        let (status, doc) = call(
            addr,
            "PUT",
            &format!("/v1/sandboxes/{id}/files"),
            &alice,
            Some(note),
        );
        assert_eq!(status, 200, "{doc}");
    }
    let server = serve_with(&home, &["--allow-unisolated"]);
    let addr = server.addr.as_str();
    let (status, doc) = call(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &alice,
        Some(reads_store),
    );
    assert_eq!(status, 200, "{doc}");
    assert_eq!(
        doc["exit_code"], 0,
        "the host sandbox reads the store: {doc}"
    );
    let (status, doc) = call(addr, "DELETE", &format!("/v1/sandboxes/{id}"), &alice, None);
    assert_eq!(status, 200, "{doc}");
}

/// A server whose environment names an S3 artifact store keeps and finds checkpoints and agent
/// sessions there, as the CLI on the same home does: a checkpoint the CLI took is listed and
/// deleted over the API, and one taken over the API is in the bucket.
#[test]
fn the_api_uses_the_artifact_store_the_server_is_configured_with() {
    let Some((env, _)) = common::s3_env("serve-store") else {
        return;
    };
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let cli = |args: &[&str]| -> Value {
        let out = home
            .command("alice", args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        json_of(&common::text(&out.stdout))
    };
    let made = cli(&["--json", "create", "-p", "host"]);
    let id = made["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let by_cli = cli(&["--json", "checkpoint", &id]);
    let by_cli = by_cli["checkpoint"]["id"].as_str().unwrap().to_owned();
    let server = serve_configured(&home, &["--allow-unisolated"], &env);
    let addr = server.addr.as_str();
    let (status, listed) = call(addr, "GET", "/v1/checkpoints", &alice, None);
    assert_eq!(status, 200, "{listed}");
    let ids: Vec<&str> = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(ids, [by_cli.as_str()], "{listed}");
    // One taken over the API (of a changed workspace) is where the CLI finds it.
    let note = json!({ "path": "note", "content_base64": "aGk=" });
    let path = format!("/v1/sandboxes/{id}/files");
    assert_eq!(call(addr, "PUT", &path, &alice, Some(note)).0, 200);
    let path = format!("/v1/sandboxes/{id}/checkpoint");
    let (status, doc) = call(addr, "POST", &path, &alice, Some(json!({})));
    assert_eq!(status, 200, "{doc}");
    let by_api = doc["checkpoint"]["id"].as_str().unwrap().to_owned();
    assert_ne!(by_api, by_cli);
    let kept = cli(&["--json", "checkpoints"]);
    assert!(
        kept["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == by_api.as_str()),
        "{kept}"
    );
    let (status, doc) = call(
        addr,
        "DELETE",
        &format!("/v1/checkpoints/{by_cli}"),
        &alice,
        None,
    );
    assert_eq!(status, 200, "{doc}");
    let (_, listed) = call(addr, "GET", "/v1/checkpoints", &alice, None);
    assert!(
        listed["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["id"] != by_cli.as_str()),
        "{listed}"
    );
    let (status, doc) = call(addr, "DELETE", &format!("/v1/sandboxes/{id}"), &alice, None);
    assert_eq!(status, 200, "{doc}");
}

/// A docker sandbox of the agent CLIs' image, made over the API; its id.
fn agent_sandbox(addr: &str, token: &str) -> String {
    let (status, made) = call(
        addr,
        "POST",
        "/v1/sandboxes",
        token,
        Some(json!({ "provider": "docker", "image": AGENT_IMAGE })),
    );
    assert_eq!(status, 200, "{made}");
    made["sandbox"]["berth_id"].as_str().unwrap().to_owned()
}

/// `berth prompt` over the API in a docker sandbox: the model is the endpoint the server was
/// started to proxy to (a scripted gateway standing in for a vendor, which takes only its own
/// key — the server's variable, never a caller's), then a script in the body; the turn's
/// conversation is kept and resumed. A script that does not parse is 400 and runs nothing.
#[test]
fn an_agent_runs_over_the_api() {
    use std::io::BufRead;
    if !agent_image() {
        return;
    }
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let vendor_script = home.path().join("vendor.toml");
    std::fs::write(
        &vendor_script,
        "schema_version = 1\n[[step]]\nshell = \"printf hi > hello.txt\"\n[[step]]\ntext = \"Done\"\n",
    )
    .unwrap();
    let mut vendor = common::RunningCli::from(
        home.command(
            "tester",
            &[
                "--json",
                "gateway",
                "--script",
                vendor_script.to_str().unwrap(),
            ],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let mut announced = String::new();
    for line in std::io::BufReader::new(vendor.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        announced.push_str(&line);
        if line == "}" {
            break;
        }
    }
    let announced = json_of(&announced);
    let origin = announced["listening"].as_str().unwrap().to_owned();
    let key = announced["token"].as_str().unwrap().to_owned();
    let server = serve_configured(
        &home,
        &[
            "--prompt-proxy",
            &origin,
            "--prompt-credential-env",
            "VENDOR_KEY",
        ],
        &[("VENDOR_KEY", key.clone())],
    );
    let addr = server.addr.as_str();
    let id = agent_sandbox(addr, &alice);
    let path = format!("/v1/sandboxes/{id}/prompt");

    let (status, first) = call(
        addr,
        "POST",
        &path,
        &alice,
        Some(json!({ "harness": "codex", "instructions": "make hello.txt" })),
    );
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["command"], "prompt", "{first}");
    assert!(first["rejected"].is_null(), "{first}");
    assert_eq!(first["tool_calls"], 1, "{first}");
    assert_eq!(first["turn"], 1, "{first}");
    let session = first["session"].as_str().unwrap().to_owned();
    let (status, read) = call(
        addr,
        "GET",
        &format!("/v1/sandboxes/{id}/files?path=hello.txt"),
        &alice,
        None,
    );
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["content_base64"], "aGk=", "{read}");

    // The next turn goes on with the session, its model a script in the body.
    let script = "schema_version = 1\n[[step]]\nshell = \"printf two > two.txt\"\n[[step]]\ntext = \"Done: two\"\n";
    let (status, next) = call(
        addr,
        "POST",
        &path,
        &alice,
        Some(json!({ "resume": session, "script": script, "instructions": "and two" })),
    );
    assert_eq!(status, 200, "{next}");
    assert_eq!(
        (next["session"].as_str(), next["turn"].as_u64()),
        (Some(session.as_str()), Some(2)),
        "{next}"
    );
    assert_eq!(next["session_id"], first["session_id"], "{next}");

    let (status, refused) = call(
        addr,
        "POST",
        &path,
        &alice,
        Some(json!({ "harness": "codex", "instructions": "x", "script": "[[step" })),
    );
    assert_eq!(status, 400, "{refused}");
    for instructions in ["nul\u{0}byte".to_owned(), "a".repeat(200 << 10)] {
        let body = json!({ "harness": "codex", "instructions": instructions, "script": script });
        let (status, refused) = call(addr, "POST", &path, &alice, Some(body));
        assert_eq!(status, 400, "{refused}");
    }
    assert!(
        !home.path().join("state/prompts/running").exists()
            || std::fs::read_dir(home.path().join("state/prompts/running"))
                .unwrap()
                .next()
                .is_none(),
        "a refused prompt left a run record"
    );
    // The vendor's key is masked wherever the runs kept something.
    assert_eq!(
        berth_testkit::files_holding(home.path(), key.as_bytes()),
        Vec::<std::path::PathBuf>::new()
    );
    let (status, doc) = call(addr, "DELETE", &format!("/v1/sandboxes/{id}"), &alice, None);
    assert_eq!(status, 200, "{doc}");
}

/// A server killed (SIGKILL) while an agent runs a prompt it serves: the run's record outlives
/// it, and the server keeps the turn when it starts again — interrupted, its exit unknown —
/// with the agent's home gone from the sandbox.
#[test]
fn a_prompt_the_server_was_killed_in_is_kept_when_it_starts_again() {
    if !agent_image() {
        return;
    }
    let home = Home::new();
    let (alice, _) = token(&home, "alice", "exec");
    let server = serve(&home);
    let id = agent_sandbox(&server.addr, &alice);
    let body = json!({
        "harness": "codex",
        "instructions": "wait",
        "script": "schema_version = 1\n[[step]]\nshell = \"sleep 60\"\n",
    })
    .to_string();
    let request = format!(
        "POST /v1/sandboxes/{id}/prompt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {alice}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut asked = TcpStream::connect(&server.addr).unwrap();
    asked.write_all(request.as_bytes()).unwrap();
    // The agent is in its command once its events say so.
    wait_for("the agent's command", || {
        common::walk(&home.path().join("state/prompts"))
            .iter()
            .filter(|p| p.ends_with("events.jsonl"))
            .any(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .contains("\"kind\":\"tool_call\"")
            })
    });
    drop(server);
    let mut answer = String::new();
    let _ = asked.read_to_string(&mut answer);
    assert!(!answer.contains("200 OK"), "{answer}");

    let server = serve(&home);
    let addr = server.addr.as_str();
    let mut listed = Value::Null;
    wait_for("the killed turn kept", || {
        listed = call(addr, "GET", "/v1/sessions", &alice, None).1;
        !listed["sessions"].as_array().unwrap().is_empty()
    });
    let session = &listed["sessions"][0];
    assert_eq!(session["turns"], 1, "{listed}");
    let turn = &session["history"][0];
    assert!(
        turn["rejected"]
            .as_str()
            .unwrap()
            .starts_with("interrupted: the berth process running this turn was killed"),
        "{listed}"
    );
    assert!(
        turn["exit"].as_str().unwrap().starts_with("unknown"),
        "{listed}"
    );
    assert_eq!(listed["killed_runs"], json!([]), "{listed}");
    let (status, looked) = call(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &alice,
        Some(json!({ "shell": "! ls -A .. | grep -q '^.berth-agent'" })),
    );
    assert_eq!((status, &looked["exit_code"]), (200, &json!(0)), "{looked}");
    let (status, doc) = call(addr, "DELETE", &format!("/v1/sandboxes/{id}"), &alice, None);
    assert_eq!(status, 200, "{doc}");
}
