//! Tests of the mission file format.

use super::*;

const GOOD: &str = r#"schema_version = 1
name = "fix-the-test"

[repository]
path = "repo"
base = "main"

[sandbox]
provider = "host"

[harness]
kind = "script"
command = "sh agent.sh"

[[tasks]]
id = "fix"
instructions = "Make the test pass."
max_attempts = 3
agent_timeout = "2m"

[tasks.validator]
command = "python3 -m unittest && echo ok > .berth/verdict"
timeout = "1m"
evidence = [".berth/verdict"]

[[tasks]]
id = "docs"
instructions = "Document it."
max_attempts = 1
agent_timeout = "30s"

[tasks.validator]
command = "test -s NOTES.md && echo ok > .berth/notes"
timeout = "10s"
evidence = [".berth/notes"]
"#;

#[test]
fn a_good_file_parses() {
    let file = parse("m.toml", GOOD).unwrap();
    assert_eq!(file.tasks.len(), 2);
    assert_eq!(
        parse_duration(&file.tasks[0].agent_timeout),
        Some(Duration::from_secs(120))
    );
}

#[test]
fn errors_name_the_file_and_line() {
    let cases = [
        (
            GOOD.replacen("max_attempts = 1", "max_attempts = 0", 1),
            "m.toml:29: `tasks[1].max_attempts` must be from 1 to 1000",
        ),
        (
            GOOD.replacen("agent_timeout = \"2m\"", "agent_timeout = \"soon\"", 1),
            "m.toml:19: `tasks[0].agent_timeout`",
        ),
        (
            GOOD.replacen("id = \"docs\"", "id = \"fix\"", 1),
            "m.toml:27: `tasks[1].id` `fix` is used by an earlier task",
        ),
        (
            GOOD.replacen("evidence = [\".berth/notes\"]", "evidence = []", 1),
            "m.toml:35: `tasks[1].validator.evidence` is empty",
        ),
        (
            GOOD.replacen("kind = \"script\"", "kind = \"aider\"", 1),
            "m.toml:12: `harness.kind` is `aider`",
        ),
        (
            GOOD.replacen("kind = \"script\"", "kind = \"codex\"", 1),
            "`harness.command` is for the `script` harness",
        ),
        (
            GOOD.replacen(
                "evidence = [\".berth/verdict\"]",
                "evidence = [\"../escape\"]",
                1,
            ),
            "inside the repository",
        ),
    ];
    for (text, want) in cases {
        let err = parse("m.toml", &text).unwrap_err().to_string();
        assert!(err.contains(want), "{err}\n  wanted: {want}");
    }
}

#[test]
fn evidence_must_name_a_file_beneath_the_repository() {
    let long = "e".repeat(1025);
    for (evidence, want) in [
        ("/etc/shadow", "inside the repository"),
        ("a/../../x", "inside the repository"),
        ("", "must name a file, not a directory"),
        (".", "must name a file, not a directory"),
        ("out/", "must name a file, not a directory"),
        ("out/.", "must name a file, not a directory"),
        ("a\\u0000b", "`a\\0b` must not contain control characters"),
        ("a\\nb", "control characters"),
        (
            "a\\u001b[31m",
            "`a\\u{1b}[31m` must not contain control characters",
        ),
        (&long, "longer than 1024 bytes"),
    ] {
        let text = GOOD.replacen(
            "evidence = [\".berth/notes\"]",
            &format!("evidence = [\"{evidence}\"]"),
            1,
        );
        let err = parse("m.toml", &text).unwrap_err().to_string();
        assert!(
            err.contains("m.toml:35: `tasks[1].validator.evidence`") && err.contains(want),
            "{evidence:?}: {err}\n  wanted: {want}"
        );
    }
    for fine in [
        "out.txt",
        ".berth/verdict",
        "./a",
        "a//b",
        "a b/ç.json",
        "..x/y..",
    ] {
        let text = GOOD.replacen(
            "evidence = [\".berth/notes\"]",
            &format!("evidence = [\"{fine}\"]"),
            1,
        );
        assert!(parse("m.toml", &text).is_ok(), "{fine}");
    }
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let broken = GOOD.replacen("max_attempts = 3", "max_attempts = = 3", 1);
    let err = parse("m.toml", &broken).unwrap_err().to_string();
    assert!(err.contains("line 18"), "{err}");
    let unknown = GOOD.replacen("[sandbox]", "[sandbox]\ncolour = 1", 1);
    assert!(parse("m.toml", &unknown)
        .unwrap_err()
        .to_string()
        .contains("unknown field `colour`"));
    // Bounded, whatever the line: a hostile one-line file does not come back as its error.
    let deep = format!(
        "schema_version = 1\nx = {}{}\n",
        "[".repeat(500_000),
        "]".repeat(500_000)
    );
    let err = parse("m.toml", &deep).unwrap_err().to_string();
    assert!(err.contains("line 2, column "), "{err}");
    assert!(err.len() < 400, "{} bytes of error", err.len());
    let long = format!(
        "schema_version = 1\nname = \"{}\u{1b}]0;x\u{7}",
        "a".repeat(300_000)
    );
    let err = parse("m.toml", &long).unwrap_err().to_string();
    assert!(err.len() < 400, "{} bytes of error", err.len());
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    // A well-formed value of the wrong type: the parser's message quotes it whole.
    let typed = GOOD.replacen(
        "max_attempts = 3",
        &format!("max_attempts = \"{}\"", "a".repeat(300_000)),
        1,
    );
    let err = parse("m.toml", &typed).unwrap_err().to_string();
    let head: String = err.chars().take(300).collect();
    assert!(err.contains("invalid type: string"), "{head}");
    assert!(err.len() < 800, "{} bytes of error", err.len());
    let future = GOOD.replacen("schema_version = 1", "schema_version = 2", 1);
    assert!(matches!(
        parse("m.toml", &future),
        Err(MissionFileError::SchemaVersion { found: 2, .. })
    ));
}

#[test]
fn hostile_values_are_field_errors_not_panics() {
    let cases = [
        (
            GOOD.replacen(
                "agent_timeout = \"2m\"",
                "agent_timeout = \"99999999999999999999h\"",
                1,
            ),
            "agent_timeout",
        ),
        (
            GOOD.replacen("timeout = \"1m\"", "timeout = \"99999999999999999999\"", 1),
            "validator.timeout",
        ),
        (
            GOOD.replacen("provider = \"host\"", "provider = \"../x\"", 1),
            "sandbox.provider",
        ),
        (
            GOOD.replacen(
                "provider = \"host\"",
                "provider = \"host\"\nfallback = [\"docker\", \"../x\"]",
                1,
            ),
            "sandbox.fallback[1]",
        ),
        (
            GOOD.replacen(
                "instructions = \"",
                &format!("instructions = \"{}", "x".repeat(MAX_INSTRUCTIONS + 1)),
                1,
            ),
            "instructions",
        ),
    ];
    for (text, field) in cases {
        let err = parse("m.toml", &text).unwrap_err().to_string();
        assert!(
            err.contains(&format!("`{field}`")) || err.contains(&format!(".{field}`")),
            "{field}: {err}"
        );
    }
    let huge = "#".repeat(MAX_FILE_BYTES as usize + 1);
    assert!(parse("m.toml", &huge)
        .unwrap_err()
        .to_string()
        .contains("at most"));
}

/// A NUL byte (TOML carries it as `\u0000`) can reach no process, so a file holding one where
/// a command, an environment value, a path or a URL is made is refused before anything is
/// durable; before, the mission registered and every attempt failed to run.
#[test]
fn a_nul_byte_in_any_free_text_field_is_refused_with_its_field() {
    let setup = GOOD.replacen(
        "timeout = \"1m\"",
        "timeout = \"1m\"\nsetup = \"pip install .\"",
        1,
    );
    let cases = [
        (
            GOOD.replacen("sh agent.sh", "sh agent.sh\\u0000x", 1),
            "harness.command",
        ),
        (
            GOOD.replacen("base = \"main", "base = \"ma\\u0000in", 1),
            "repository.base",
        ),
        (
            GOOD.replacen("path = \"repo", "path = \"re\\u0000po", 1),
            "repository.path",
        ),
        (
            GOOD.replacen("path = \"repo\"", "url = \"https://h/r\\u0000.git\"", 1),
            "repository.url",
        ),
        (
            GOOD.replacen("Document it.", "Document\\u0000 it.", 1),
            "tasks[1].instructions",
        ),
        (
            GOOD.replacen("test -s NOTES.md", "test -s NOTES.md\\u0000", 1),
            "tasks[1].validator.command",
        ),
        (
            setup.replacen("pip install .", "pip install\\u0000 .", 1),
            "tasks[0].validator.setup",
        ),
    ];
    for (text, field) in cases {
        let err = parse("m.toml", &text).unwrap_err();
        let MissionFileError::Invalid {
            field: got,
            problem,
            line,
            ..
        } = &err
        else {
            panic!("{field}: not a field error: {err}");
        };
        assert_eq!(got, field, "{err}");
        assert!(problem.contains("NUL byte"), "{err}");
        assert!(
            *line > 1,
            "{field}: the line should point at the key: {err}"
        );
    }
    // The same file without the NUL parses: the refusal is the NUL's, nothing else's.
    parse("m.toml", &setup).unwrap();
}

#[test]
fn attempts_are_bounded() {
    for (attempts, ok) in [
        ("1", true),
        ("1000", true),
        ("1001", false),
        ("4000000000", false),
    ] {
        let text = GOOD.replacen("max_attempts = 3", &format!("max_attempts = {attempts}"), 1);
        match parse("m.toml", &text) {
            Ok(_) => assert!(ok, "{attempts} was accepted"),
            Err(err) => {
                assert!(!ok, "{attempts}: {err}");
                assert!(
                    err.to_string()
                        .contains("`tasks[0].max_attempts` must be from 1 to 1000"),
                    "{err}"
                );
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

    #[test]
    fn durations_parse_or_refuse_never_panic(text in "\\PC{0,40}", digits in "[0-9.]{1,40}", unit in "(ms|s|m|h|d|)") {
        let _ = parse_duration(&text);
        if let Some(d) = parse_duration(&format!("{digits}{unit}")) {
            proptest::prop_assert!(d > Duration::ZERO && d <= MAX_DURATION);
        }
    }

    #[test]
    fn mission_files_parse_or_refuse_never_panic(text in "\\PC{0,400}", at in 0usize..2000, insert in "\\PC{0,40}") {
        let _ = parse("m.toml", &text);
        // Mutations of a valid file: a typed error or a file, never a panic.
        let mut mutated = GOOD.to_owned();
        let mut at = at.min(mutated.len());
        while !mutated.is_char_boundary(at) { at -= 1; }
        mutated.insert_str(at, &insert);
        let _ = parse("m.toml", &mutated);
    }
}

/// `BERTH_BLESS=1 cargo test -p berth-mission` regenerates the published schema.
#[test]
fn published_json_schema_is_in_sync() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../schemas/mission-file.schema.json");
    let generated = json_schema();
    if std::env::var_os("BERTH_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).unwrap_or_default() == generated,
        "schemas/mission-file.schema.json is out of date; run BERTH_BLESS=1 cargo test -p berth-mission"
    );
}

#[test]
fn agent_harnesses_need_a_gateway_and_take_no_command() {
    let agent = |section: &str| {
        GOOD.replacen(
            "[harness]\nkind = \"script\"\ncommand = \"sh agent.sh\"\n",
            section,
            1,
        )
    };
    for kind in AGENT_HARNESSES {
        let text = agent(&format!(
            "[harness]\nkind = \"{kind}\"\nmodel = \"scripted\"\n[harness.gateway]\nscript = \"model.toml\"\n"
        ));
        let file = parse("m.toml", &text).unwrap();
        assert_eq!(file.harness.kind, kind);
        assert_eq!(
            file.harness.gateway.unwrap().script.as_deref(),
            Some("model.toml")
        );
    }
    let proxy = agent(
        "[harness]\nkind = \"claude-code\"\n[harness.gateway]\nproxy = \"http://127.0.0.1:8080\"\ncredential_env = \"ANTHROPIC_KEY\"\n",
    );
    assert!(parse("m.toml", &proxy).is_ok());
    for (section, want) in [
        ("[harness]\nkind = \"codex\"\n", "needs `[harness.gateway]`"),
        (
            "[harness]\nkind = \"codex\"\n[harness.gateway]\nscript = \"a\"\nproxy = \"http://x\"\n",
            "exactly one of",
        ),
        (
            "[harness]\nkind = \"codex\"\n[harness.gateway]\nproxy = \"http://x:1\"\n",
            "needs `credential_env`",
        ),
        (
            "[harness]\nkind = \"codex\"\n[harness.gateway]\nproxy = \"http://x:1\"\ncredential_env = \"sk-live-value!\"\n",
            "the NAME of the variable",
        ),
        (
            "[harness]\nkind = \"codex\"\n[harness.gateway]\nproxy = \"ftp://api.example.com\"\ncredential_env = \"K\"\n",
            "http:// or https:// origin",
        ),
        (
            "[harness]\nkind = \"codex\"\n[harness.gateway]\nscript = \"/etc/passwd\"\n",
            "relative to the mission file",
        ),
        (
            "[harness]\nkind = \"codex\"\nmodel = \"a b\"\n[harness.gateway]\nscript = \"m.toml\"\n",
            "not a model name",
        ),
        (
            "[harness]\nkind = \"script\"\n",
            "`harness.command` is required",
        ),
        (
            "[harness]\nkind = \"codex\"\nidle_timeout = \"soon\"\n[harness.gateway]\nscript = \"m.toml\"\n",
            "`harness.idle_timeout`",
        ),
        (
            "[harness]\nkind = \"script\"\ncommand = \"x\"\n[harness.gateway]\nscript = \"m.toml\"\n",
            "takes only `command`",
        ),
        (
            "[harness]\nkind = \"codex\"\nlogin = \"/root/.codex/auth.json\"\n[harness.gateway]\nscript = \"m.toml\"\n",
            "never a path or a value",
        ),
        (
            "[harness]\nkind = \"opencode\"\nlogin = \"mine\"\n[harness.gateway]\nscript = \"m.toml\"\n",
            "`codex` and `claude-code`",
        ),
        (
            "[harness]\nkind = \"claude-code\"\nlogin = \"mine\"\n[harness.gateway]\nproxy = \"http://x:1\"\ncredential_env = \"K\"\n",
            "drop `credential_env`",
        ),
        (
            "[harness]\nkind = \"script\"\ncommand = \"x\"\nlogin = \"mine\"\n",
            "takes only `command`",
        ),
    ] {
        let err = parse("m.toml", &agent(section)).unwrap_err().to_string();
        assert!(err.contains(want), "{section:?}: {err}");
    }
}
