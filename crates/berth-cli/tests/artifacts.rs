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

/// `mission run` of the bundled example, which succeeds.
fn run_example(home: &Path) {
    let out = run(home, &["mission", "run", example().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Variables a command runs with (the S3 configuration, or none for the local store).
type Env = Vec<(&'static str, String)>;

fn run_env(home: &Path, args: &[&str], env: &Env) -> std::process::Output {
    let mut command = berth(home, args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn json_env(home: &Path, args: &[&str], env: &Env) -> (i32, Value) {
    if env.is_empty() {
        return json(home, args);
    }
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = run_env(home, &full, env);
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), doc)
}

/// The S3 configuration of a fresh prefix on the test server, or why there is none.
fn s3_env() -> Option<Env> {
    let Ok(endpoint) = std::env::var("BERTH_TEST_S3_ENDPOINT") else {
        if std::env::var("BERTH_SKIP_S3").as_deref() == Ok("1") {
            return None;
        }
        panic!("BERTH_TEST_S3_ENDPOINT is not set: run scripts/test (it starts SeaweedFS), or BERTH_SKIP_S3=1");
    };
    let prefix = format!(
        "cli-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    Some(vec![
        ("BERTH_ARTIFACTS_URL", format!("s3://artifacts/{prefix}")),
        ("BERTH_ARTIFACTS_ENDPOINT", endpoint),
        ("BERTH_ARTIFACTS_KEY_ID_VAR", "S3_KEY".into()),
        ("BERTH_ARTIFACTS_SECRET_VAR", "S3_SECRET".into()),
        ("S3_KEY", "test".into()),
        ("S3_SECRET", "testsecret".into()),
    ])
}

/// Every claim indexed; the index names every object once; nothing else in the store (after
/// reconcile, which removes what killed writes left staged).
fn assert_published(home: &Path, bundles: usize) {
    assert_published_in(home, bundles, &Vec::new());
}

/// [`assert_published`] against the object store `env` configures. On S3 a key holds one
/// object, so "one copy of each" is that no object is left that no claim names.
fn assert_published_in(home: &Path, bundles: usize, env: &Env) {
    let json = |home: &Path, args: &[&str]| json_env(home, args, env);
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
    if !env.is_empty() {
        return;
    }
    let stored = files_under(&home.join("artifacts"));
    assert_eq!(
        stored.len(),
        keys.len(),
        "one copy of each object: {stored:?}"
    );
}

/// `artifacts export --parquet` writes every indexed row; both Berth's reader and pyarrow (not
/// Berth's code) read back exactly the rows `artifacts query` returns.
fn assert_parquet_export_matches_the_index(home: &Path) {
    let (_, all) = json(home, &["artifacts", "query"]);
    let expected = all["artifacts"].as_array().unwrap().clone();
    assert!(expected.len() > 4, "{all:#}");
    let dir = home.join("export");
    let (code, doc) = json(
        home,
        &["artifacts", "export", "--parquet", dir.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["exported"]["rows"], expected.len());
    let file = dir.join("artifacts.parquet");
    let ours: Vec<Value> = berth_artifacts::export::read_parquet(&file)
        .unwrap()
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect();
    assert_eq!(ours, expected);

    if std::env::var_os("BERTH_SKIP_PYARROW").is_some() {
        eprintln!("BERTH_SKIP_PYARROW set: the pyarrow read-back is skipped on purpose");
    } else {
        let python = std::env::var("BERTH_TEST_PYARROW").expect(
            "BERTH_TEST_PYARROW names a python with pyarrow (scripts/setup-pyarrow); set \
             BERTH_SKIP_PYARROW=1 to skip on purpose",
        );
        let read = std::process::Command::new(python)
            .args([
                "-c",
                "import json, sys, pyarrow.parquet as pq\n\
                 t = pq.read_table(sys.argv[1])\n\
                 kv = pq.read_metadata(sys.argv[1]).metadata\n\
                 print(json.dumps({'schema': kv[b'berth.schema'].decode(), \
                 'rows': t.to_pylist()}))",
                file.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(
            read.status.success(),
            "{}",
            String::from_utf8_lossy(&read.stderr)
        );
        let theirs: Value = serde_json::from_slice(&read.stdout).unwrap();
        assert_eq!(theirs["schema"], "berth.artifacts.index/v1");
        assert_eq!(theirs["rows"], Value::Array(expected.clone()));
    }

    // A filtered export holds only what the filter matches; a symlinked directory is refused.
    let (code, doc) = json(
        home,
        &[
            "artifacts",
            "export",
            "--parquet",
            dir.to_str().unwrap(),
            "--accepted",
            "--mime",
            "text/x-diff",
        ],
    );
    assert_eq!(code, 0, "{doc}");
    let filtered = berth_artifacts::export::read_parquet(&file).unwrap();
    assert_eq!(filtered.len(), 1);
    assert!(filtered[0].accepted && filtered[0].mime == "text/x-diff");
    let link = home.join("export-link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let (code, doc) = json(
        home,
        &["artifacts", "export", "--parquet", link.to_str().unwrap()],
    );
    assert_eq!(code, 5, "{doc}");
    assert!(doc["error"]["message"]
        .as_str()
        .unwrap()
        .contains("symlinks are refused"));
}

#[test]
fn each_attempt_leaves_an_indexed_bundle_read_back_verified() {
    let home = home();
    run_example(home.path());
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

    // The index as Parquet: read back by Berth's reader and by pyarrow, every row equal.
    assert_parquet_export_matches_the_index(home.path());

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
    kill_at_every_publication_step(&mut Vec::new);
}

#[test]
fn a_kill_at_every_publication_step_to_s3_is_finished_by_resume_and_reconcile() {
    if s3_env().is_some() {
        // A fresh prefix for every run: each is a store of its own.
        kill_at_every_publication_step(&mut || s3_env().expect("checked above"));
    }
}

/// SIGKILL `mission run` at publication step 1, 2, …, until a run is no longer killed (then
/// every step has been a kill point); after each, `mission resume` and `artifacts reconcile`
/// leave every claim indexed, the index complete and no object unaccounted for.
fn kill_at_every_publication_step(fresh_env: &mut dyn FnMut() -> Env) {
    let mut n = 1;
    loop {
        let home = home();
        let env = &fresh_env();
        let fault = format!("kill-in-publication:{n}");
        let mut env_with_fault = env.clone();
        env_with_fault.push(("BERTH_FAULT", fault.clone()));
        let out = run_env(
            home.path(),
            &["mission", "run", example().to_str().unwrap()],
            &env_with_fault,
        );
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
        let resumed = run_env(home.path(), &["mission", "resume", &id], env);
        assert!(
            resumed.status.success(),
            "{fault}: {}{}",
            String::from_utf8_lossy(&resumed.stdout),
            String::from_utf8_lossy(&resumed.stderr)
        );
        assert_example_succeeded(home.path(), &id);
        assert_published_in(home.path(), 2, env);
        n += 1;
        assert!(n < 100, "publication never ended");
    }
}

/// With `BERTH_ARTIFACTS_URL` naming an S3 bucket (a real SeaweedFS server), missions publish
/// there; the credentials are named by variable and masked if they ever appear in a bundle.
#[test]
fn bundles_go_to_an_s3_bucket_when_configured() {
    let Some(env) = s3_env() else { return };
    let home = home();
    let with_s3 = |args: &[&str]| run_env(home.path(), args, &env);
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
    let location: Env = env
        .iter()
        .filter(|(name, _)| matches!(*name, "BERTH_ARTIFACTS_URL" | "BERTH_ARTIFACTS_ENDPOINT"))
        .cloned()
        .collect();
    assert_eq!(location.len(), 2);
    let mut missing = berth(home.path(), &["artifacts", "reconcile"]);
    for (name, value) in &location {
        missing.env(name, value);
    }
    let missing = missing.env_remove("AWS_ACCESS_KEY_ID").output().unwrap();
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

/// With the `iceberg` feature, `mission run` appends each bundle to the Iceberg table as it is
/// indexed; the rows read back through the catalog equal the store's index.
#[cfg(feature = "iceberg")]
#[test]
fn the_index_is_an_iceberg_table_appended_as_bundles_are_indexed() {
    let home = home();
    run_example(home.path());
    let key = |r: &Value| {
        (
            r["bundle_id"].as_str().unwrap().to_owned(),
            r["path"].as_str().unwrap().to_owned(),
        )
    };
    let (_, all) = json(home.path(), &["artifacts", "query"]);
    let mut expected = all["artifacts"].as_array().unwrap().clone();
    expected.sort_by_key(key);
    let (code, table) = json(home.path(), &["artifacts", "iceberg"]);
    assert_eq!(code, 0, "{table}");
    assert_eq!(table["table"], "berth.artifacts");
    // Already appended by the mission as each bundle was indexed: nothing left to append.
    assert_eq!(table["synced"]["rows"], 0, "{table:#}");
    let mut rows = table["artifacts"].as_array().unwrap().clone();
    rows.sort_by_key(key);
    assert_eq!(rows, expected);
    // The catalog lives in the store's database; the table's metadata under the home.
    assert!(home
        .path()
        .join("iceberg/berth/artifacts/metadata")
        .is_dir());
    let (code, reconciled) = json(home.path(), &["artifacts", "reconcile"]);
    assert_eq!(code, 0);
    assert_eq!(reconciled["iceberg"]["rows"], 0, "{reconciled}");
}

/// What a sandbox prints that looks like a credential is masked before it becomes durable
/// anywhere: the agent's and the validator's output in the store, the rejection reason, the
/// bundle, the index and every file under `$BERTH_HOME`. The repository never holds the token
/// whole (the scripts assemble it), so any copy found was written by Berth.
#[test]
fn a_token_the_sandbox_prints_is_masked_everywhere_berth_writes() {
    let home = home();
    let tail = "Q7".repeat(18);
    let token = format!("ghp_{tail}");
    let agent =
        format!("t=ghp_; echo \"agent says ${{t}}{tail}\"; echo \"err ${{t}}{tail}\" >&2\n");
    let validator = format!("t=ghp_; echo \"validator failed with ${{t}}{tail}\" >&2; exit 1");
    let file = write_mission(home.path(), &agent, &validator, "20s", "\".berth-out\"", 1);
    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, reason, _) = first_reason(home.path());
    assert!(reason.contains("validator failed with ****"), "{reason}");
    let (_, rows) = json(home.path(), &["artifacts", "query"]);
    assert!(!rows["artifacts"].as_array().unwrap().is_empty(), "{rows}");
    for path in files_under(home.path()) {
        let bytes = std::fs::read(&path).unwrap_or_default();
        assert!(
            !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
            "the token was written to {}",
            path.display()
        );
    }
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&token));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(&token));
}

/// The accepted attempt's `patch.diff` of a mission in `home`.
fn accepted_patch(home: &Path) -> Vec<u8> {
    let (_, accepted) = json(
        home,
        &["artifacts", "query", "--accepted", "--mime", "text/x-diff"],
    );
    let rows = accepted["artifacts"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{accepted:#}");
    let bundle = rows[0]["bundle_id"].as_str().unwrap();
    let out = run(home, &["artifacts", "get", bundle, "patch.diff"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `git diff --binary` of the task's final commit against its parent, computed here from the
/// mission's final bundle, independently of Berth.
fn independent_patch(home: &Path, id: &str) -> Vec<u8> {
    let clone = tempfile::tempdir().unwrap();
    let bundle = home.join("missions").join(id).join("t.bundle");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "core.hooksPath=/dev/null"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let dir = clone.path().join("r");
    git(&[
        "clone",
        "-q",
        bundle.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    git(&[
        "-C",
        dir.to_str().unwrap(),
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--binary",
        "HEAD^",
        "HEAD",
        "--",
    ])
}

/// The patch is git's exact bytes — made at capture beside the bundle, or made again at
/// publication when a crash took the kept one. The change ends in a blank context line and
/// touches a binary file: trimming the output (as a first version did) drops that line and
/// the patch no longer applies.
#[test]
fn the_patch_is_git_s_exact_bytes_kept_at_capture_or_made_again() {
    let agent = "printf 'A\\nb\\nc\\n\\n' > lines.txt\nprintf 'bin\\000\\377\\n' > blob.bin\n";
    for lose_the_kept_patch in [false, true] {
        let home = home();
        let dir = tempfile::tempdir().unwrap();
        let file = write_mission(
            dir.path(),
            agent,
            "echo ok > .verdict",
            "30s",
            "\".verdict\"",
            1,
        );
        std::fs::write(dir.path().join("repo/lines.txt"), "a\nb\nc\n\n").unwrap();
        std::fs::write(dir.path().join("repo/blob.bin"), b"bin\0\x01\n").unwrap();
        let args = ["mission", "run", file.to_str().unwrap()];
        if lose_the_kept_patch {
            // Killed at the accepted attempt's first publication step: captured, not published.
            let out = berth(home.path(), &args)
                .env("BERTH_FAULT", "kill-in-publication:1")
                .output()
                .unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                out.status.signal(),
                Some(9),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let id = only_mission(home.path());
            let kept: Vec<_> = files_under(&home.path().join("missions").join(&id))
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "patch"))
                .collect();
            assert_eq!(kept.len(), 1, "one patch kept at capture: {kept:?}");
            std::fs::remove_file(&kept[0]).unwrap();
            let resumed = run(home.path(), &["mission", "resume", &id]);
            assert!(
                resumed.status.success(),
                "{}",
                String::from_utf8_lossy(&resumed.stderr)
            );
        } else {
            let out = run(home.path(), &args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let id = only_mission(home.path());
        let patch = accepted_patch(home.path());
        assert!(
            patch.ends_with(b"\n \n"),
            "{}",
            String::from_utf8_lossy(&patch)
        );
        assert!(String::from_utf8_lossy(&patch).contains("GIT binary patch"));
        assert_eq!(
            patch,
            independent_patch(home.path(), &id),
            "lost the kept patch: {lose_the_kept_patch}"
        );
    }
}

/// A misconfigured artifact store says which variable to fix, with the code of its kind: a
/// missing S3 credential is `auth` (exit 7; it was "not supported yet", exit 4, pointing at the
/// README's mission section), a malformed URL is invalid input naming BERTH_ARTIFACTS_URL
/// (exit 5; it said "fix the mission file"), in `artifacts` commands and in a mission, which
/// stops before finalizing and finishes on resume once the store is right. A file a bundle
/// does not hold is "not found" (the message said only "`PATH` in bundle ID").
#[test]
fn a_misconfigured_artifact_store_names_the_variable_to_fix() {
    let home = home();
    run_example(home.path());
    let (_, doc) = json(home.path(), &["artifacts", "query", "--path", "facts.json"]);
    let bundle = doc["artifacts"][0]["bundle_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let canary = "canary-secret-9f2c41";
    let s3 = |url: &str, key_id: Option<&str>| -> Env {
        let mut env = vec![
            ("BERTH_ARTIFACTS_URL", url.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", canary.to_owned()),
        ];
        if let Some(key_id) = key_id {
            env.push(("AWS_ACCESS_KEY_ID", key_id.to_owned()));
        }
        env
    };
    let get = ["artifacts", "get", bundle.as_str(), "facts.json"];
    let mut no_key = berth(
        home.path(),
        &["--json", "artifacts", "get", &bundle, "facts.json"],
    );
    for (name, value) in s3("s3://bucket", None) {
        no_key.env(name, value);
    }
    let no_key = no_key.env_remove("AWS_ACCESS_KEY_ID").output().unwrap();
    let doc: Value = serde_json::from_slice(&no_key.stdout).unwrap();
    assert_eq!(no_key.status.code(), Some(7), "{doc}");
    assert_eq!(doc["error"]["kind"], "auth", "{doc}");
    assert!(
        doc["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("export AWS_ACCESS_KEY_ID"),
        "{doc}"
    );
    let malformed = run_env(home.path(), &get, &s3("http://bucket", Some("key-id")));
    let stderr = String::from_utf8_lossy(&malformed.stderr);
    assert_eq!(malformed.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("fix BERTH_ARTIFACTS_URL"), "{stderr}");
    assert!(!stderr.contains(canary), "{stderr}");
    let absent = run(home.path(), &["artifacts", "get", &bundle, "../facts.json"]);
    let stderr = String::from_utf8_lossy(&absent.stderr);
    assert_eq!(absent.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("not found: `../facts.json`"), "{stderr}");

    // A mission: stopped before its accepted attempt finalizes, finished on resume.
    let mission_home = missions_support::home();
    let mut run_it = berth(
        mission_home.path(),
        &["mission", "run", example().to_str().unwrap()],
    );
    run_it
        .env("BERTH_ARTIFACTS_URL", "s3://bucket")
        .env_remove("AWS_ACCESS_KEY_ID");
    let stopped = run_it.output().unwrap();
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("export AWS_ACCESS_KEY_ID"), "{stderr}");
    let id = only_mission(mission_home.path());
    let resumed = run(mission_home.path(), &["mission", "resume", &id]);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_example_succeeded(mission_home.path(), &id);
}
