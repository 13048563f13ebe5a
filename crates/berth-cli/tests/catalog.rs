//! End-to-end tests of verification, the shipped evidence, the catalog gate, the lifecycle
//! benchmark and the provider scaffold.

use serde_json::Value;
use std::path::Path;
use std::process::Command;
mod common;

use common::*;

#[test]
fn verify_writes_evidence_and_the_gate_reads_it_honestly() {
    let home = Home::new();
    let evidence = home.path().join("evidence");
    let key = home.path().join("signing.key");
    let (code, doc) = home.json(&["catalog", "keygen", key.to_str().unwrap()]);
    assert_eq!(code, 0, "{doc}");
    let public = format!("{}.pub", key.display());
    let (code, doc) = home.json(&[
        "verify",
        "host",
        "--out",
        evidence.to_str().unwrap(),
        "--sign-key",
        key.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["failed_clauses"], 0);
    let seed = std::fs::read_to_string(&key).unwrap();
    assert!(
        !doc.to_string().contains(seed.trim()),
        "the private key was printed"
    );
    let record_path = evidence.join("host.json");
    let show = |extra: &[&str]| {
        let mut args = vec![
            "catalog",
            "show",
            "host",
            "--evidence",
            evidence.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        home.json(&args).1
    };
    let check = || {
        home.json(&[
            "catalog",
            "check",
            "--evidence",
            evidence.to_str().unwrap(),
            "--trust-key",
            &public,
        ])
    };
    let doc = show(&["--trust-key", &public]);
    let caps = &doc["providers"][0]["capabilities"];
    assert_eq!(caps["core"]["status"], "VERIFIED", "{doc}");
    assert_eq!(caps["files"]["status"], "VERIFIED");
    assert_eq!(caps["suspend_resume"]["status"], "UNSUPPORTED");
    assert_eq!(
        doc["providers"][0]["evidence"]["origin"]["kind"],
        "explicit"
    );
    // Signed by a key nobody trusts: UNKNOWN, with the reason.
    let doc = show(&[]);
    let reason = doc["providers"][0]["capabilities"]["core"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("not trusted here"), "{reason}");
    // Providers without a record stay UNKNOWN, never verified.
    let (_, doc) = home.json(&[
        "catalog",
        "show",
        "docker",
        "--evidence",
        evidence.to_str().unwrap(),
    ]);
    assert_eq!(
        doc["providers"][0]["capabilities"]["core"]["reason"],
        "no evidence record"
    );
    // Built-in adapters whose supported capabilities are not VERIFIED fail the check.
    let (code, doc) = check();
    assert_eq!(code, 12, "{doc}");
    let problems = doc["problems"].to_string();
    assert!(
        problems.contains(
            "bwrap/core: declared supported by an adapter in this build, but not VERIFIED"
        ),
        "{problems}"
    );
    assert!(!problems.contains("host/"), "{problems}");
    // A missing evidence directory is an error, not "ok".
    let (code, doc) = home.json(&["catalog", "check", "--evidence", "/nonexistent"]);
    assert_eq!(code, 5, "{doc}");

    // Tampering: flip a grade without resealing → UNKNOWN, with the reason.
    let text = std::fs::read_to_string(&record_path).unwrap();
    let mut record: berth_evidence::EvidenceRecord = serde_json::from_str(&text).unwrap();
    let files = record
        .clauses
        .iter_mut()
        .find(|c| c.clause == "files.round_trip_binary")
        .unwrap();
    files.grade = berth_evidence::Grade::Fail;
    files.diagnostics = vec!["injected failure".into()];
    std::fs::write(&record_path, serde_json::to_string(&record).unwrap()).unwrap();
    let doc = show(&["--trust-key", &public]);
    let reason = doc["providers"][0]["capabilities"]["files"]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("content hash does not match"), "{reason}");
    // Resealed without the key: unsigned, so UNKNOWN.
    std::fs::write(
        &record_path,
        serde_json::to_string(&record.clone().seal()).unwrap(),
    )
    .unwrap();
    let doc = show(&["--trust-key", &public]);
    let reason = doc["providers"][0]["capabilities"]["files"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("not signed"), "{reason}");

    // A signed failing record: FAILED, and `catalog check` fails with exit 12.
    let signing = berth_evidence::signing_key_from_hex(&seed).unwrap();
    std::fs::write(
        &record_path,
        serde_json::to_string(&record.sign(&signing)).unwrap(),
    )
    .unwrap();
    let doc = show(&["--trust-key", &public]);
    assert_eq!(
        doc["providers"][0]["capabilities"]["files"]["status"],
        "FAILED"
    );
    let (code, doc) = check();
    assert_eq!(code, 12, "{doc}");
    assert!(doc["problems"].to_string().contains("host/files"), "{doc}");
}

/// The evidence shipped with this build proves it: a fresh `BERTH_HOME` sees host, bwrap and
/// docker VERIFIED from the signed records in `catalog/evidence/`, with when, where and which
/// adapter build. (After an adapter changes, this fails until `scripts/refresh-evidence`.)
#[test]
fn shipped_evidence_verifies_this_build() {
    let home = Home::new();
    let (code, doc) = home.json(&["catalog", "show"]);
    assert_eq!(code, 0, "{doc}");
    for id in ["host", "bwrap", "docker"] {
        let row = doc["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap();
        assert_eq!(
            row["capabilities"]["core"]["status"], "VERIFIED",
            "{id}: {row}"
        );
        assert_eq!(row["evidence"]["origin"]["kind"], "shipped", "{row}");
        assert!(row["evidence"]["finished_at"].is_string());
        assert!(row["evidence"]["signed_by"].is_string());
    }
    let (code, doc) = home.json(&["catalog", "check"]);
    assert_eq!(
        code, 0,
        "scripts/refresh-evidence, then commit catalog/evidence/: {doc}"
    );
}

#[test]
fn lifecycle_bench_reports_phases_cleanup_and_unknowns_never_zero() {
    let home = Home::new();
    let out = home.path().join("bench.json");
    let (code, doc) = home.json(&[
        "bench",
        "host",
        "e2b",
        "--iterations",
        "3",
        "--mode",
        "staggered",
        "--stagger-ms",
        "20",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{doc}");
    let host = &doc["results"][0];
    assert_eq!(host["provider"], "host");
    assert_eq!(host["mode"], "staggered");
    assert_eq!(host["staggerDelayMs"], 20);
    assert_eq!(host["successRate"], 1.0);
    assert_eq!(host["iterations"].as_array().unwrap().len(), 3);
    for iteration in host["iterations"].as_array().unwrap() {
        assert_eq!(iteration["cleanup"], "verified_gone");
        let phases = iteration["phases"].as_object().unwrap();
        for phase in [
            "create_returned",
            "ready",
            "first_exec_ok",
            "destroy_called",
            "destroy_returned",
            "verified_gone",
        ] {
            assert!(
                phases[phase].as_f64().unwrap() > 0.0,
                "{phase} must be measured: {iteration}"
            );
        }
        assert_eq!(iteration["ttiMs"], phases["first_exec_ok"]);
    }
    assert_eq!(host["summary"]["ttiMs"]["n"], 3);
    assert_eq!(host["reuseProbe"]["reused"], 0);
    // A catalog-only provider is skipped with its reason, not reported as zeros.
    let e2b = &doc["results"][1];
    assert_eq!(e2b["skipped"], true);
    assert!(e2b["skipReason"].as_str().unwrap().contains("no adapter"));
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(written["results"][0]["provider"], "host");
    let (_, ledger) = home.json(&["ledger", "list"]);
    assert!(
        ledger["entries"].as_array().unwrap().is_empty(),
        "bench left sandboxes: {ledger}"
    );
}

#[test]
fn provider_scaffold_compiles_passes_its_tests_and_the_catalog_check() {
    let home = Home::new();
    let root = home.path().join("checkout");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let (code, doc) = home.json(&[
        "provider",
        "new",
        "acme-cloud",
        "--root",
        root.to_str().unwrap(),
        "--berth-source",
        repo.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{doc}");
    let krate = root.join("crates/berth-provider-acme-cloud");
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "tests/conformance.rs",
        "CHECKLIST.md",
    ] {
        assert!(krate.join(file).is_file(), "{file} not generated");
    }
    // Never overwrite.
    let (code, doc) = home.json(&[
        "provider",
        "new",
        "acme-cloud",
        "--root",
        root.to_str().unwrap(),
        "--berth-source",
        repo.to_str().unwrap(),
    ]);
    assert_eq!(code, 5, "{doc}");
    let (code, _) = home.json(&[
        "provider",
        "new",
        "Bad_Name",
        "--root",
        root.to_str().unwrap(),
        "--berth-source",
        repo.to_str().unwrap(),
    ]);
    assert_eq!(code, 5);

    // It builds, resolving the same dependency versions as Berth. Its conformance tests fail
    // while the adapter is unwritten, and pass only when skipped explicitly, saying so.
    std::fs::copy(repo.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    // `nice`: the nested build must not starve the tests running beside it.
    let cargo_test = |skip: bool| {
        let mut cmd = Command::new("nice");
        cmd.args([
            "-n",
            "19",
            env!("CARGO"),
            "test",
            "--quiet",
            "--",
            "--nocapture",
        ])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", repo.join("target/scaffold-check"))
        // Its own workspace, so Berth's profile does not reach it: no debug info (disk).
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env_remove("BERTH_SKIP_ACME_CLOUD");
        if skip {
            cmd.env("BERTH_SKIP_ACME_CLOUD", "1");
        }
        cmd.output().unwrap()
    };
    let skipped = cargo_test(true);
    assert!(
        skipped.status.success(),
        "generated crate failed: {}{}",
        text(&skipped.stdout),
        text(&skipped.stderr)
    );
    assert!(
        text(&skipped.stderr).contains("SKIPPED (BERTH_SKIP_ACME_CLOUD set)"),
        "{}",
        text(&skipped.stderr)
    );
    let unskipped = cargo_test(false);
    assert!(
        !unskipped.status.success(),
        "an unwritten adapter's conformance tests passed without being skipped: {}",
        text(&unskipped.stdout)
    );

    // The catalog accepts its manifest and reports it honestly: nothing verified.
    let catalog = root.join("catalog/providers");
    let (code, doc) = home.json(&["catalog", "check", "--catalog", catalog.to_str().unwrap()]);
    assert_eq!(code, 0, "{doc}");
    let (_, doc) = home.json(&["catalog", "show", "--catalog", catalog.to_str().unwrap()]);
    let caps = &doc["providers"][0]["capabilities"];
    assert_eq!(caps["core"]["status"], "UNKNOWN");
    assert_eq!(caps["files"]["status"], "UNSUPPORTED");
}

/// `catalog keygen FILE` makes two new files: a public half that already exists (here a
/// symlink planted to a file of someone else's) is refused without following it, and the
/// private half it had just made is removed, so nothing is left half-made.
#[test]
fn keygen_never_follows_or_replaces_and_leaves_nothing_half_made() {
    let home = Home::new();
    let key = home.path().join("signing.key");
    let victim = home.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, home.path().join("signing.key.pub")).unwrap();
    let out = home.run(&["catalog", "keygen", key.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("signing.key.pub"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(
        !key.exists(),
        "the private key was left without its public half"
    );
    // An existing private key is never replaced either.
    std::fs::write(&key, "an older key\n").unwrap();
    let out = home.run(&["catalog", "keygen", key.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&key).unwrap(), "an older key\n");
}
