//! Tests of the error classification.

use super::*;

/// Library wrappers keep their inner error as `source`: the typed cause is found by walking
/// the chain (no wrapper is unwrapped by hand), and its text is said once.
#[test]
fn wrapped_causes_classify_through_the_chain_and_are_said_once() {
    let missing = FactoryError::MissingCredential {
        provider: "e2b".into(),
        variable: "E2B_API_KEY".into(),
        purpose: "API access".into(),
    };
    let said = missing.to_string();
    let wrapped = anyhow::Error::new(berth_orchestrator::OrchestratorError::from(missing));
    let failure = classify(&wrapped);
    assert_eq!((failure.kind, failure.exit_code), ("auth", code::AUTH));
    assert_eq!(failure.message, said);
    assert_eq!(wrapped.chain().count(), 2, "the wrapper keeps its source");

    let gone = LedgerError::from(StoreError::NotFound(
        berth_store::Record::LedgerEntry,
        "bx-1".into(),
    ));
    let failure = classify(&anyhow::Error::new(gone).context("destroy"));
    assert_eq!(
        (failure.kind, failure.exit_code),
        ("not_found", code::NOT_FOUND)
    );
    assert_eq!(failure.message, "destroy: no ledger entry `bx-1`");

    let swept = LedgerError::from(StoreError::SweptWhileMade("bx-2".into()));
    let failure = classify(&anyhow::Error::new(swept).context("create"));
    assert_eq!(
        (failure.kind, failure.exit_code),
        ("conflict", code::CONFLICT)
    );
    assert_eq!(
        failure.message,
        "create: ledger entry `bx-2` was swept while its resource was being made"
    );

    let fallback = FallbackError::from(FactoryError::NoAdapter { id: "e2b".into() });
    let failure = classify(&anyhow::Error::new(fallback));
    assert_eq!(
        (failure.kind, failure.exit_code),
        ("not_found", code::NOT_FOUND)
    );
}

/// A ledger failure inside the fallback loop is carried as an unknown-kind provider error;
/// its typed cause decides (a run that cannot be claimed live is a setup error naming the
/// directory), and an unknown error with an untyped cause stays unknown.
#[test]
fn an_unknown_provider_error_is_classified_by_its_typed_cause() {
    let claim = LedgerError::from(StoreError::RunLock {
        run_id: "run-1".into(),
        dir: "/home/u/.berth/berth.db.runs".into(),
        error: std::io::Error::from_raw_os_error(20),
    });
    let carried = ProviderError::new(ErrorKind::Unknown, "host", format!("ledger: {claim}"))
        .with_source(claim);
    let failure = classify(&anyhow::Error::new(carried));
    assert_eq!((failure.kind, failure.exit_code), ("setup", code::SETUP));
    assert!(
        failure
            .hint
            .as_deref()
            .is_some_and(|h| h.contains("/home/u/.berth/berth.db.runs must be a directory")),
        "{:?}",
        failure.hint
    );
    assert_eq!(
        failure.message.matches("Not a directory").count(),
        1,
        "said once"
    );

    let untyped = ProviderError::new(ErrorKind::Unknown, "host", "odd")
        .with_source(std::io::Error::other("deep"));
    let failure = classify(&anyhow::Error::new(untyped));
    assert_eq!(
        (failure.kind, failure.exit_code),
        ("unknown", code::INTERNAL)
    );
}

/// A missing mission or bundle is named as what it is, with where to list its kind (it
/// was once "no ledger entry" with a hint about sandboxes).
#[test]
fn a_missing_record_is_named_with_where_to_list_its_kind() {
    use berth_store::Record;
    for (record, said, listing) in [
        (Record::Mission, "no mission `m-1`", "`berth mission list`"),
        (
            Record::Bundle,
            "no artifact bundle `m-1`",
            "`berth artifacts query`",
        ),
        (
            Record::LedgerEntry,
            "no ledger entry `m-1`",
            "`berth ledger list`",
        ),
    ] {
        let missing = StoreError::NotFound(record, "m-1".into());
        let failure = classify(&anyhow::Error::new(missing));
        assert_eq!(
            (failure.kind, failure.exit_code, failure.message.as_str()),
            ("not_found", code::NOT_FOUND, said)
        );
        let hint = failure.hint.unwrap_or_default();
        assert!(hint.contains(listing), "{hint}");
    }
}

/// Berth's own git failing on a full disk is a setup error naming the disk, not a
/// mission-file problem; a repository that is not one still is.
#[test]
fn a_full_disk_under_the_work_repository_is_not_a_mission_file_problem() {
    use berth_orchestrator::OrchestratorError as O;
    let full = O::Repository(
        "git init: fatal: cannot copy '/usr/share/git-core/templates/description' to \
         '/home/u/.berth/missions/m/.work.git/description': No space left on device"
            .into(),
    );
    let failure = classify(&anyhow::Error::new(full));
    assert_eq!((failure.kind, failure.exit_code), ("setup", code::SETUP));
    assert!(failure
        .hint
        .unwrap_or_default()
        .contains("disk under BERTH_HOME is full"));
    let not_a_dir = O::Repository("/tmp/x is not a directory".into());
    let failure = classify(&anyhow::Error::new(not_a_dir));
    assert_eq!(
        (failure.kind, failure.exit_code),
        ("invalid_request", code::INVALID)
    );
}

/// A provider out of capacity (the host provider's full disk) is exit 6; the hint names the
/// disk and says where a fallback is named (`create --fallback`, a mission's
/// `sandbox.fallback`; `cp`, `exec` and `run` have no such flag).
#[test]
fn capacity_names_the_disk_and_the_commands_that_fall_back() {
    let full = ProviderError::new(ErrorKind::Capacity, "host", "cannot write `f`")
        .with_source(std::io::Error::from(std::io::ErrorKind::StorageFull));
    let failure = classify(&anyhow::Error::new(full));
    assert_eq!(
        (failure.kind, failure.exit_code),
        ("capacity", code::UNAVAILABLE)
    );
    let hint = failure.hint.unwrap_or_default();
    assert!(
        hint.contains("disk may be full")
            && hint.contains("give `create` a provider to fall back to")
            && hint.contains("`sandbox.fallback`"),
        "{hint}"
    );
}

/// A message echoing a huge value keeps its start and end, cut on character boundaries,
/// and says how many bytes it left out.
#[test]
fn a_huge_message_keeps_its_start_and_end_and_says_what_was_cut() {
    let huge = format!("no sandbox `{}` in the ledger", "é".repeat(50_000));
    let failure = classify(&anyhow::anyhow!(huge.clone()));
    let message = failure.message;
    assert!(
        message.len() <= MESSAGE_HEAD + MESSAGE_TAIL + 64,
        "{}",
        message.len()
    );
    let (head, rest) = message.split_once(" …[").expect("the cut is marked");
    let (cut, tail) = rest
        .split_once(" bytes not shown]… ")
        .expect("the cut is sized");
    assert!(head.starts_with("no sandbox `éé") && tail.ends_with("éé` in the ledger"));
    let cut: usize = cut.parse().expect("a byte count");
    assert_eq!(head.len() + cut + tail.len(), huge.len());
    assert!(huge.starts_with(head) && huge.ends_with(tail));

    let short = "no sandbox `bx-1` in the ledger";
    assert_eq!(classify(&anyhow::anyhow!(short)).message, short);
}
