use super::*;

fn host_text() -> &'static str {
    embedded()
        .iter()
        .find(|(origin, _)| origin.ends_with("host.toml"))
        .map(|(_, text)| *text)
        .unwrap()
}

#[test]
fn embedded_manifests_parse() {
    for (origin, text) in embedded() {
        let manifest = parse(origin, text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(manifest.schema_version, SCHEMA_VERSION);
    }
}

#[test]
fn host_manifest_says_it_isolates_nothing() {
    let host = parse("host", host_text()).unwrap();
    assert_eq!(host.isolation.class, IsolationClass::None);
    assert!(host.isolation.statement.starts_with("Isolates nothing"));
    assert_eq!(
        host.support(Capability::SuspendResume),
        berth_contract::Support::Unsupported
    );
}

#[test]
fn syntax_error_names_origin_and_line() {
    let broken = host_text().replacen("display_name = ", "display_name = = ", 1);
    let err = parse("broken.toml", &broken).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ManifestError::Syntax { .. }), "{text}");
    assert!(text.contains("broken.toml"), "{text}");
    assert!(text.contains("line 4,"), "{text}");
}

#[test]
fn future_schema_version_is_a_version_error() {
    let future = host_text().replacen("schema_version = 1", "schema_version = 9", 1);
    let err = parse("future.toml", &future).unwrap_err();
    assert!(
        matches!(err, ManifestError::SchemaVersion { found: 9, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("reads schema_version 1"));
}

#[test]
fn unknown_field_is_rejected() {
    let extra = host_text().replacen("[isolation]", "colour = \"blue\"\n[isolation]", 1);
    let err = parse("extra.toml", &extra).unwrap_err();
    assert!(err.to_string().contains("unknown field `colour`"), "{err}");
}

#[test]
fn undeclared_capability_is_rejected() {
    let missing = host_text().replacen("ttl = \"unsupported\"\n", "", 1);
    let err = parse("missing.toml", &missing).unwrap_err();
    assert!(err.to_string().contains("does not declare `ttl`"), "{err}");
}

#[test]
fn bad_support_value_is_rejected() {
    let bad = host_text().replacen("fork = \"supported\"", "fork = \"maybe\"", 1);
    let err = parse("bad.toml", &bad).unwrap_err();
    assert!(err.to_string().contains("unknown variant `maybe`"), "{err}");
}

#[test]
fn unknown_capability_name_is_rejected() {
    let bad = host_text().replacen("fork = \"supported\"", "teleport = \"supported\"", 1);
    let err = parse("bad.toml", &bad).unwrap_err();
    assert!(err.to_string().contains("teleport"), "{err}");
}

#[test]
fn credential_value_in_name_field_is_rejected() {
    let bad = host_text().replacen(
        "credentials = []",
        "credentials = [{ name = \"sk-live-abc123\", kind = \"secret\", required = true, purpose = \"x\" }]",
        1,
    );
    let err = parse("bad.toml", &bad).unwrap_err();
    assert!(
        err.to_string().contains("not an environment variable name"),
        "{err}"
    );
}

#[test]
fn bad_id_is_rejected() {
    let bad = host_text().replacen("id = \"host\"", "id = \"Host Provider\"", 1);
    let err = parse("bad.toml", &bad).unwrap_err();
    assert!(err.to_string().contains("field `id`"), "{err}");
}

#[test]
fn load_dir_rejects_duplicates_and_reads_sorted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.toml"), host_text()).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
    let loaded = load_dir(dir.path()).unwrap();
    assert_eq!(loaded.len(), 1);
    std::fs::write(dir.path().join("b.toml"), host_text()).unwrap();
    let err = load_dir(dir.path()).unwrap_err();
    assert!(matches!(err, ManifestError::Duplicate { .. }), "{err}");
}

/// A `*.toml` in a catalog directory that is a FIFO, or far larger than any manifest, is an
/// error naming the file at once (a FIFO blocked the read for ever).
#[test]
fn load_dir_refuses_fifos_and_huge_files_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("a.toml");
    berth_testkit::make_fifo(&fifo);
    let chain = |err: &ManifestError| {
        let source = std::error::Error::source(err).map(|s| s.to_string());
        format!("{err}: {}", source.unwrap_or_default())
    };
    let path = dir.path().to_owned();
    let err = berth_testkit::at_once("loading a catalog with a FIFO", move || {
        load_dir(&path).map(|m| m.len())
    })
    .unwrap_err();
    let said = chain(&err);
    assert!(
        said.contains("a.toml") && said.contains("not a regular file"),
        "{said}"
    );
    std::fs::remove_file(&fifo).unwrap();
    let huge = format!("{}\n# {}\n", host_text(), "x".repeat(2 << 20));
    std::fs::write(dir.path().join("b.toml"), huge).unwrap();
    let said = chain(&load_dir(dir.path()).unwrap_err());
    assert!(said.contains("larger than"), "{said}");
}

#[test]
fn in_repo_catalog_matches_embedded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../catalog/providers");
    let from_disk = load_dir(&dir).unwrap();
    for (origin, text) in embedded() {
        let manifest = parse(origin, text).unwrap();
        assert!(from_disk.contains(&manifest), "{origin} differs from disk");
    }
}

/// The published schema must equal the generated one. Regenerate with
/// `BERTH_BLESS=1 cargo test -p berth-manifest`.
#[test]
fn published_json_schema_is_in_sync() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../schemas/provider-manifest.schema.json");
    let generated = json_schema();
    if std::env::var_os("BERTH_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == generated,
        "schemas/provider-manifest.schema.json is out of date; run \
         `BERTH_BLESS=1 cargo test -p berth-manifest` and commit the result"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

    /// Any text, and any single insertion into a real manifest: a typed error or a manifest,
    /// never a panic.
    #[test]
    fn manifests_parse_or_refuse_never_panic(text in "\\PC{0,300}", at in 0usize..4000, insert in "\\PC{0,30}") {
        let _ = crate::parse("m.toml", &text);
        let mut mutated = include_str!("../../../catalog/providers/host.toml").to_owned();
        let mut at = at.min(mutated.len());
        while !mutated.is_char_boundary(at) {
            at -= 1;
        }
        mutated.insert_str(at, &insert);
        let _ = crate::parse("m.toml", &mutated);
    }
}

/// Every embedded manifest has a JSON form made from its exact text, and reads through it as the
/// same manifest as through TOML; any other text goes through `parse` and gets its errors.
#[test]
fn embedded_manifests_read_the_same_through_their_json_form() {
    for (origin, text) in embedded() {
        assert!(
            embedded::AS_JSON
                .iter()
                .any(|(o, t, _)| o == origin && t == text),
            "{origin} has no JSON form"
        );
        let through_json = parse_embedded(origin, text).unwrap();
        let through_toml = parse(origin, text).unwrap();
        assert_eq!(through_json, through_toml, "{origin}");
    }
    // A changed text is not the one a JSON form was made from: it is parsed as TOML.
    let changed = host_text().replace("schema_version = 1", "schema_version = 99");
    assert!(matches!(
        parse_embedded("catalog/providers/host.toml", &changed),
        Err(ManifestError::SchemaVersion { found: 99, .. })
    ));
    let broken = format!("{}\n[[[", host_text());
    assert!(matches!(
        parse_embedded("catalog/providers/host.toml", &broken),
        Err(ManifestError::Syntax { .. })
    ));
}
