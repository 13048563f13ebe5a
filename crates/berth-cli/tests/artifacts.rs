//! Artifact bundles through the `berth` binary: the bundled example leaves one bundle per
//! attempt (rejected and accepted), indexed and queryable; files come back hash-verified; a
//! tampered object is refused; a SIGKILL at every publication step, then `mission resume` and
//! `artifacts reconcile`, leaves every claim indexed, the index complete and one copy of each
//! object.

use std::path::Path;

use serde_json::Value;
mod missions_support;

use missions_support::*;

fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// Every claim indexed; the index names every object once; nothing else in the store.
fn assert_published(home: &Path, bundles: usize) {
    let (code, doc) = json(home, &["artifacts", "query"]);
    assert_eq!(code, 0, "{doc}");
    let rows = doc["artifacts"].as_array().unwrap();
    let mut ids: Vec<&str> = rows
        .iter()
        .map(|r| r["bundle_id"].as_str().unwrap())
        .collect();
    ids.dedup();
    assert_eq!(ids.len(), bundles, "{doc:#}");
    for id in &ids {
        let (code, shown) = json(home, &["artifacts", "show", id]);
        assert_eq!(code, 0);
        assert_eq!(shown["state"], "indexed", "{shown:#}");
        let files = shown["manifest"]["files"].as_array().unwrap().len();
        let indexed = rows.iter().filter(|r| r["bundle_id"] == *id).count();
        assert_eq!(
            indexed,
            files + 1,
            "every file and the manifest are indexed"
        );
    }
    let mut keys: Vec<&str> = rows
        .iter()
        .map(|r| r["object_key"].as_str().unwrap())
        .collect();
    keys.sort();
    keys.dedup();
    let stored = files_under(&home.join("artifacts"));
    assert_eq!(
        stored.len(),
        keys.len(),
        "one copy of each object: {stored:?}"
    );
    let (code, reconciled) = json(home, &["artifacts", "reconcile"]);
    assert_eq!(code, 0);
    assert_eq!(
        reconciled["reconciled"]["orphans"],
        Value::Array(vec![]),
        "{reconciled}"
    );
    assert_eq!(
        reconciled["reconciled"]["waiting"],
        Value::Array(vec![]),
        "{reconciled}"
    );
}

#[test]
fn each_attempt_leaves_an_indexed_bundle_read_back_verified() {
    let home = home();
    let out = run(
        home.path(),
        &["mission", "run", example().to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_published(home.path(), 2);
    let id = only_mission(home.path());
    let (_, accepted) = json(
        home.path(),
        &[
            "artifacts",
            "query",
            "--mission",
            &id,
            "--accepted",
            "--mime",
            "text/x-diff",
        ],
    );
    let rows = accepted["artifacts"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{accepted:#}");
    let bundle = rows[0]["bundle_id"].as_str().unwrap().to_owned();
    let (_, rejected) = json(home.path(), &["artifacts", "query", "--rejected"]);
    assert!(rejected["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["accepted"] == false && r["bundle_id"] != bundle.as_str()));

    // The patch, verified, on stdout; with --json only through --out.
    let patch = run(home.path(), &["artifacts", "get", &bundle, "patch.diff"]);
    assert!(patch.status.success());
    let text = String::from_utf8_lossy(&patch.stdout);
    assert!(text.contains("+    return a + b"), "{text}");
    let (code, refused) = json(home.path(), &["artifacts", "get", &bundle, "patch.diff"]);
    assert_eq!(code, 5, "{refused}");
    let out_file = home.path().join("patch-copy.diff");
    let (code, got) = json(
        home.path(),
        &[
            "artifacts",
            "get",
            &bundle,
            "patch.diff",
            "--out",
            out_file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{got}");
    assert_eq!(std::fs::read(&out_file).unwrap(), patch.stdout);
    // The manifest says what the attempt was.
    let (_, shown) = json(home.path(), &["artifacts", "show", &bundle]);
    let manifest = &shown["manifest"];
    assert_eq!(manifest["schema"], "berth.bundle/v1");
    assert_eq!(manifest["accepted"], true);
    assert!(manifest["lifecycle"]["checkpoint"].is_string());
    assert_eq!(manifest["mission"], id.as_str());

    // Tampering with a stored object is detected; nothing is written out.
    let object = rows[0]["object_key"].as_str().unwrap();
    std::fs::write(home.path().join("artifacts").join(object), b"tampered").unwrap();
    let tampered = run(home.path(), &["artifacts", "get", &bundle, "patch.diff"]);
    assert_eq!(tampered.status.code(), Some(13));
    assert!(tampered.stdout.is_empty());
    // Unknown bundles and paths are clear not-founds.
    assert_eq!(
        run(home.path(), &["artifacts", "get", "bd-nope", "x"])
            .status
            .code(),
        Some(3)
    );
    assert_eq!(
        run(
            home.path(),
            &["artifacts", "get", &bundle, "../../etc/passwd"]
        )
        .status
        .code(),
        Some(3)
    );
    // Another owner sees none of it.
    let other = berth(home.path(), &["--json", "artifacts", "query"])
        .env("BERTH_OWNER", "someone-else")
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&other.stdout).unwrap();
    assert_eq!(doc["artifacts"], Value::Array(vec![]));
}

#[test]
fn a_kill_at_every_publication_step_is_finished_by_resume_and_reconcile() {
    // Until a run is no longer killed: then every step has been a kill point.
    let mut n = 1;
    loop {
        let home = home();
        let fault = format!("kill-in-publication:{n}");
        let out = berth(
            home.path(),
            &["mission", "run", example().to_str().unwrap()],
        )
        .env("BERTH_FAULT", &fault)
        .output()
        .unwrap();
        use std::os::unix::process::ExitStatusExt;
        if out.status.signal() != Some(9) {
            assert!(
                out.status.success(),
                "{fault}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(n > 10, "only {n} publication steps in the example");
            break;
        }
        let id = only_mission(home.path());
        let resumed = run(home.path(), &["mission", "resume", &id]);
        assert!(
            resumed.status.success(),
            "{fault}: {}{}",
            String::from_utf8_lossy(&resumed.stdout),
            String::from_utf8_lossy(&resumed.stderr)
        );
        assert_example_succeeded(home.path(), &id);
        assert_published(home.path(), 2);
        n += 1;
        assert!(n < 100, "publication never ended");
    }
}

/// With `BERTH_ARTIFACTS_URL` naming an S3 bucket (a real SeaweedFS server), missions publish
/// there; the credentials are named by variable and masked if they ever appear in a bundle.
#[test]
fn bundles_go_to_an_s3_bucket_when_configured() {
    let Ok(endpoint) = std::env::var("BERTH_TEST_S3_ENDPOINT") else {
        if std::env::var("BERTH_SKIP_S3").as_deref() == Ok("1") {
            return;
        }
        panic!("BERTH_TEST_S3_ENDPOINT is not set: run scripts/test (it starts SeaweedFS), or BERTH_SKIP_S3=1");
    };
    let home = home();
    let prefix = format!(
        "cli-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let with_s3 = |args: &[&str]| {
        berth(home.path(), args)
            .env("BERTH_ARTIFACTS_URL", format!("s3://artifacts/{prefix}"))
            .env("BERTH_ARTIFACTS_ENDPOINT", &endpoint)
            .env("BERTH_ARTIFACTS_KEY_ID_VAR", "S3_KEY")
            .env("BERTH_ARTIFACTS_SECRET_VAR", "S3_SECRET")
            .env("S3_KEY", "test")
            .env("S3_SECRET", "testsecret")
            .output()
            .unwrap()
    };
    let out = with_s3(&["mission", "run", example().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !home.path().join("artifacts").exists(),
        "nothing went to the local store"
    );
    let query = with_s3(&[
        "--json",
        "artifacts",
        "query",
        "--accepted",
        "--path",
        "patch.diff",
    ]);
    let doc: Value = serde_json::from_slice(&query.stdout).unwrap();
    let bundle = doc["artifacts"][0]["bundle_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let patch = with_s3(&["artifacts", "get", &bundle, "patch.diff"]);
    assert!(
        patch.status.success(),
        "{}",
        String::from_utf8_lossy(&patch.stderr)
    );
    assert!(String::from_utf8_lossy(&patch.stdout).contains("+    return a + b"));
    let reconciled = with_s3(&["--json", "artifacts", "reconcile"]);
    let doc: Value = serde_json::from_slice(&reconciled.stdout).unwrap();
    assert_eq!(doc["reconciled"]["orphans"], Value::Array(vec![]), "{doc}");
    // A missing credential is a clear error, not a silent local fallback.
    let missing = berth(home.path(), &["artifacts", "reconcile"])
        .env("BERTH_ARTIFACTS_URL", format!("s3://artifacts/{prefix}"))
        .env("BERTH_ARTIFACTS_ENDPOINT", &endpoint)
        .env_remove("AWS_ACCESS_KEY_ID")
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("AWS_ACCESS_KEY_ID"));
}

/// While the object store is unreachable the accepted attempt does not finalize (the mission
/// stops, nothing is lost); once it is back, `mission resume` publishes and finalizes.
#[test]
fn a_mission_whose_bundle_cannot_be_published_waits_and_resumes() {
    let Ok(endpoint) = std::env::var("BERTH_TEST_S3_ENDPOINT") else {
        if std::env::var("BERTH_SKIP_S3").as_deref() == Ok("1") {
            return;
        }
        panic!("BERTH_TEST_S3_ENDPOINT is not set: run scripts/test (it starts SeaweedFS), or BERTH_SKIP_S3=1");
    };
    let home = home();
    let prefix = format!("down-{}", std::process::id());
    let with = |endpoint: &str, args: &[&str]| {
        berth(home.path(), args)
            .env("BERTH_ARTIFACTS_URL", format!("s3://artifacts/{prefix}"))
            .env("BERTH_ARTIFACTS_ENDPOINT", endpoint)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "testsecret")
            .output()
            .unwrap()
    };
    // Nothing listens on port 9 here: every publication fails.
    let down = with(
        "http://127.0.0.1:9",
        &["mission", "run", example().to_str().unwrap()],
    );
    assert!(
        !down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stdout)
    );
    let id = only_mission(home.path());
    let (_, status) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(status["mission"]["state"]["state"], "running", "{status:#}");
    let accepted = &status["mission"]["tasks"][0]["attempts"][1]["status"];
    assert_eq!(accepted["status"], "accepted", "{status:#}");
    assert_eq!(accepted["finalized"], false, "{status:#}");
    assert!(accepted["bundle"].is_null(), "{status:#}");
    // Back: resume publishes both bundles and finalizes.
    let up = with(&endpoint, &["mission", "resume", &id]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let (_, status) = json(home.path(), &["mission", "status", &id]);
    let accepted = &status["mission"]["tasks"][0]["attempts"][1]["status"];
    assert_eq!(accepted["finalized"], true, "{status:#}");
    assert!(accepted["bundle"].as_str().unwrap().starts_with("bd-"));
    let query = with(
        &endpoint,
        &["--json", "artifacts", "query", "--mission", &id],
    );
    let doc: Value = serde_json::from_slice(&query.stdout).unwrap();
    let mut bundles: Vec<&str> = doc["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bundle_id"].as_str().unwrap())
        .collect();
    bundles.dedup();
    assert_eq!(bundles.len(), 2, "{doc:#}");
}
