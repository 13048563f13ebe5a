//! The gate on fixture records.

use super::*;

fn host() -> ProviderManifest {
    let (origin, text) = berth_manifest::embedded()
        .iter()
        .find(|(o, _)| o.ends_with("host.toml"))
        .unwrap();
    berth_manifest::parse(origin, text).unwrap()
}

const CLAUSES: &[(&str, Option<&str>)] = &[
    ("core.create_ready_exec", None),
    ("core.destroy_twice_verified_gone", None),
    ("files.round_trip_binary", Some("files")),
    ("fork.independent_copy", Some("fork")),
];

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T12:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[7; 32])
}

fn expect() -> Expectations<'static> {
    Expectations {
        clauses: CLAUSES.to_vec(),
        adapter_source_hash: Some("sha256:adapter"),
        conformance_kit_hash: "sha256:kit",
        now: now(),
        trusted_keys: vec![key().verifying_key().to_bytes()],
    }
}

fn record(grades: &[(&str, Grade)]) -> EvidenceRecord {
    EvidenceRecord {
        schema: EVIDENCE_SCHEMA.into(),
        provider: "host".into(),
        adapter_version: "0.1.0".into(),
        adapter_source_hash: "sha256:adapter".into(),
        conformance_kit_hash: "sha256:kit".into(),
        provenance: Provenance {
            source: "crates/berth-provider-host".into(),
            pinned: "workspace".into(),
            observed: None,
        },
        environment: Environment {
            os: "linux".into(),
            arch: "x86_64".into(),
            kernel: "6.18".into(),
            berth_version: "0.1.0".into(),
        },
        run_id: "run-1".into(),
        started_at: now() - Duration::hours(1),
        finished_at: now() - Duration::hours(1),
        clauses: grades
            .iter()
            .map(|(id, grade)| ClauseEvidence {
                clause: (*id).into(),
                capability: CLAUSES
                    .iter()
                    .find(|(c, _)| c == id)
                    .and_then(|(_, cap)| cap.map(str::to_owned)),
                grade: *grade,
                diagnostics: vec![format!("{id} said so")],
                duration_ms: 1.0,
            })
            .collect(),
        metrics: BTreeMap::from([(
            "create_ms".into(),
            Metric::Unknown {
                reason: "not measured in fixtures".into(),
            },
        )]),
        content_hash: String::new(),
        signature: None,
    }
    .sign(&key())
}

fn all_pass() -> EvidenceRecord {
    record(
        &CLAUSES
            .iter()
            .map(|(id, _)| (*id, Grade::Pass))
            .collect::<Vec<_>>(),
    )
}

#[test]
fn passing_fresh_record_verifies_what_it_covers() {
    let status = evaluate(&host(), Some(&all_pass()), &expect());
    assert_eq!(status["core"], Status::Verified);
    assert_eq!(status["files"], Status::Verified);
    assert_eq!(status["fork"], Status::Verified);
    assert_eq!(status["suspend_resume"], Status::Unsupported);
    assert!(
        matches!(&status["listing"], Status::Unknown(why) if why.contains("no conformance clause covers")),
        "{:?}",
        status["listing"]
    );
}

#[test]
fn no_record_is_unknown_never_verified() {
    let status = evaluate(&host(), None, &expect());
    assert_eq!(status["core"], Status::Unknown("no evidence record".into()));
    assert_eq!(
        status["files"],
        Status::Unknown("no evidence record".into())
    );
    assert_eq!(status["stop_start"], Status::Unsupported);
}

#[test]
fn a_failing_clause_fails_its_capability_only() {
    let rec = record(&[
        ("core.create_ready_exec", Grade::Pass),
        ("core.destroy_twice_verified_gone", Grade::Pass),
        ("files.round_trip_binary", Grade::Fail),
        ("fork.independent_copy", Grade::Pass),
    ]);
    let status = evaluate(&host(), Some(&rec), &expect());
    assert_eq!(
        status["files"],
        Status::Failed(
            "clause `files.round_trip_binary` failed: files.round_trip_binary said so".into()
        )
    );
    assert_eq!(status["core"], Status::Verified);
    assert_eq!(status["fork"], Status::Verified);
}

#[test]
fn stale_records_are_unknown() {
    let mut rec = all_pass();
    rec.finished_at = now() - Duration::days(MAX_AGE_DAYS + 1);
    let rec = rec.sign(&key());
    let status = evaluate(&host(), Some(&rec), &expect());
    assert!(
        matches!(&status["core"], Status::Unknown(why) if why.starts_with("stale")),
        "{:?}",
        status["core"]
    );
}

/// The clauses are the kit's: a record graded by another kit (a clause since changed, weakened
/// or strengthened) proves nothing about this build's clauses, even for the same adapter.
#[test]
fn a_record_graded_by_another_conformance_kit_is_unknown() {
    let mut rec = all_pass();
    rec.conformance_kit_hash = "sha256:older-kit".into();
    let rec = rec.sign(&key());
    let status = evaluate(&host(), Some(&rec), &expect());
    assert_eq!(
        status["core"],
        Status::Unknown(
            "record was graded by conformance kit sha256:older-kit, this build's is sha256:kit"
                .into()
        )
    );
}

#[test]
fn a_record_for_another_adapter_build_is_unknown() {
    let mut rec = all_pass();
    rec.adapter_source_hash = "sha256:older".into();
    let rec = rec.sign(&key());
    let status = evaluate(&host(), Some(&rec), &expect());
    assert_eq!(
        status["files"],
        Status::Unknown(
            "record is for adapter source sha256:older, this build is sha256:adapter".into()
        )
    );
}

#[test]
fn a_tampered_record_is_unknown() {
    let mut rec = record(&[
        ("core.create_ready_exec", Grade::Pass),
        ("core.destroy_twice_verified_gone", Grade::Pass),
        ("files.round_trip_binary", Grade::Fail),
        ("fork.independent_copy", Grade::Pass),
    ]);
    // Flip the failure to a pass after sealing.
    rec.clauses[2].grade = Grade::Pass;
    let status = evaluate(&host(), Some(&rec), &expect());
    assert!(
        matches!(&status["files"], Status::Unknown(why) if why.contains("content hash does not match")),
        "{:?}",
        status["files"]
    );
    assert!(matches!(&status["core"], Status::Unknown(_)));
}

#[test]
fn a_missing_clause_is_unknown() {
    let rec = record(&[
        ("core.create_ready_exec", Grade::Pass),
        ("core.destroy_twice_verified_gone", Grade::Pass),
        ("fork.independent_copy", Grade::Pass),
    ]);
    let status = evaluate(&host(), Some(&rec), &expect());
    assert_eq!(
        status["files"],
        Status::Unknown("clause `files.round_trip_binary` missing from the record".into())
    );
    assert_eq!(status["fork"], Status::Verified);
}

#[test]
fn unverified_clauses_and_wrong_provider_stay_unknown() {
    let rec = record(&[
        ("core.create_ready_exec", Grade::Unverified),
        ("core.destroy_twice_verified_gone", Grade::Pass),
    ]);
    let status = evaluate(&host(), Some(&rec), &expect());
    assert!(matches!(&status["core"], Status::Unknown(why) if why.contains("unverified")));
    let mut other = all_pass();
    other.provider = "docker".into();
    let other = other.sign(&key());
    let status = evaluate(&host(), Some(&other), &expect());
    assert_eq!(
        status["core"],
        Status::Unknown("record is for provider `docker`".into())
    );
}

#[test]
fn records_round_trip_through_json_with_their_hash() {
    let rec = all_pass();
    let json = serde_json::to_string(&rec).unwrap();
    let back: EvidenceRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(back.compute_hash(), rec.content_hash);
    assert!(
        json.contains("\"kind\":\"unknown\""),
        "unknown metrics are explicit: {json}"
    );
}

/// The published schema must equal the generated one
/// (`BERTH_BLESS=1 cargo test -p berth-evidence` regenerates it).
#[test]
fn published_json_schema_is_in_sync() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../schemas/evidence-record.schema.json");
    let generated = json_schema();
    if std::env::var_os("BERTH_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == generated,
        "schemas/evidence-record.schema.json is out of date; run BERTH_BLESS=1 cargo test -p berth-evidence"
    );
}

#[test]
fn catalog_only_providers_are_unknown_for_lack_of_an_adapter() {
    let no_adapter = Expectations {
        adapter_source_hash: None,
        ..expect()
    };
    let status = evaluate(&host(), Some(&all_pass()), &no_adapter);
    assert_eq!(
        status["core"],
        Status::Unknown("no adapter in this build".into())
    );
    assert_eq!(status["stop_start"], Status::Unsupported);
}

#[test]
fn unsigned_untrusted_and_forged_records_are_unknown() {
    let unknown = |rec: &EvidenceRecord, needle: &str| {
        let status = evaluate(&host(), Some(rec), &expect());
        assert!(
            matches!(&status["core"], Status::Unknown(why) if why.contains(needle)),
            "{needle}: {:?}",
            status["core"]
        );
    };
    let unsigned = all_pass().seal();
    unknown(&unsigned, "not signed");
    let stranger = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    unknown(&all_pass().sign(&stranger), "not trusted here");
    // A signature copied from another record, under the trusted key's id.
    let mut forged = all_pass();
    let mut other = all_pass();
    other.run_id = "run-2".into();
    forged.signature = other.sign(&stranger).signature.map(|mut s| {
        s.key_id = key_id(&key().verifying_key().to_bytes());
        s
    });
    unknown(&forged, "does not verify");
    // A re-sealed record after editing drops the old signature.
    let mut edited = all_pass();
    edited.clauses[0].grade = Grade::Pass;
    unknown(&edited.seal(), "not signed");
    assert_eq!(
        evaluate(&host(), Some(&all_pass()), &expect())["core"],
        Status::Verified
    );
}

#[test]
fn key_files_parse_or_refuse() {
    assert!(signing_key_from_hex(&"07".repeat(32)).is_ok());
    assert!(signing_key_from_hex("zz").is_err());
    assert!(signing_key_from_hex(&"07".repeat(31)).is_err());
    let public = hex::encode(key().verifying_key().to_bytes());
    assert_eq!(
        public_key_from_hex(&format!(" {public}\n")).unwrap(),
        key().verifying_key().to_bytes()
    );
}

/// A failure the manifest declares is still FAILED (the truth), marked known so the catalog
/// check accepts exactly it; an undeclared one is a plain failure; a declared one that passes
/// is stale.
#[test]
fn known_failures_are_reported_failed_and_only_they_are_accepted() {
    let mut manifest = host();
    manifest.verification.known_failures.insert(
        "core.destroy_twice_verified_gone".into(),
        "the vendor cannot prove absence".into(),
    );
    let failing = record(&[
        ("core.create_ready_exec", Grade::Pass),
        ("core.destroy_twice_verified_gone", Grade::Fail),
        ("files.round_trip_binary", Grade::Fail),
        ("fork.independent_copy", Grade::Pass),
    ]);
    let status = evaluate(&manifest, Some(&failing), &expect());
    match &status["core"] {
        Status::Failed(why) => {
            assert!(why.starts_with(KNOWN_FAILURE), "{why}");
            assert!(why.contains("cannot prove absence"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    match &status["files"] {
        Status::Failed(why) => assert!(!why.starts_with(KNOWN_FAILURE), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(stale_known_failures(&manifest, &failing).is_empty());
    // The same declaration over a record where the clause passes is stale.
    assert_eq!(
        stale_known_failures(&manifest, &all_pass()),
        vec!["core.destroy_twice_verified_gone".to_owned()]
    );
    // Without the declaration the same record's core is a plain failure.
    let status = evaluate(&host(), Some(&failing), &expect());
    assert!(matches!(&status["core"], Status::Failed(why) if !why.starts_with(KNOWN_FAILURE)));
}

/// A provider whose live proof needs a secret says which, instead of "no evidence record".
#[test]
fn missing_record_of_a_credentialed_provider_names_the_credentials() {
    let (origin, text) = berth_manifest::embedded()
        .iter()
        .find(|(o, _)| o.ends_with("computesdk.e2b.toml"))
        .unwrap();
    let e2b = berth_manifest::parse(origin, text).unwrap();
    let status = evaluate(&e2b, None, &expect());
    assert_eq!(
        status["core"],
        Status::Unknown("no live evidence: needs E2B_API_KEY".into())
    );
}
