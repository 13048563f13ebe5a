use super::*;
use crate::sidecar::VendorError;
use berth_contract::Command;

fn err(message: &str, status: Option<u16>, code: Option<&str>) -> VendorError {
    VendorError {
        name: "Error".into(),
        message: message.into(),
        status,
        code: code.map(str::to_owned),
    }
}

#[test]
fn vendor_errors_map_onto_berth_kinds() {
    let cases = [
        (err("anything", Some(401), None), ErrorKind::Auth),
        (err("anything", Some(429), None), ErrorKind::RateLimited),
        (err("anything", Some(503), None), ErrorKind::Capacity),
        (err("anything", Some(502), None), ErrorKind::Provider5xx),
        (err("x", None, Some("ECONNREFUSED")), ErrorKind::Unavailable),
        (err("x", None, Some("BERTH_NOT_FOUND")), ErrorKind::NotFound),
        // ComputeSDK's rewritten messages (the status is gone by then).
        (
            err(
                "E2B authentication failed. Please check your E2B_API_KEY environment variable.",
                None,
                None,
            ),
            ErrorKind::Auth,
        ),
        (
            err(
                "E2B quota exceeded. Please check your usage at the vendor",
                None,
                None,
            ),
            ErrorKind::Quota,
        ),
        (
            err("Rate limit reached", None, None),
            ErrorKind::RateLimited,
        ),
        (
            err("Failed to create E2B sandbox: fetch failed", None, None),
            ErrorKind::Unavailable,
        ),
        (err("something odd", None, None), ErrorKind::Unknown),
    ];
    for (error, kind) in cases {
        assert_eq!(classify(&error), kind, "{error:?}");
    }
    // Auth never falls back; quota and capacity do.
    assert!(!ErrorKind::Auth.allows_fallback());
    assert!(ErrorKind::Quota.allows_fallback() && ErrorKind::Capacity.allows_fallback());
    assert!(ErrorKind::RateLimited.allows_fallback());
}

#[test]
fn argv_is_quoted_for_the_shell_line_computesdk_takes() {
    let argv = Command::Argv(vec![
        "printf".into(),
        "%s|".into(),
        "it's".into(),
        "$HOME".into(),
        "a b".into(),
        "".into(),
        "`id`".into(),
        "x;rm -rf /".into(),
    ]);
    let line = command_line(&argv);
    let out = std::process::Command::new("sh")
        .args(["-c", &line])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "it's|$HOME|a b||`id`|x;rm -rf /|"
    );
}

#[test]
fn exit_127_is_unknown_not_a_made_up_not_found() {
    let provider = new(
        "computesdk:just-bash",
        BridgeConfig {
            node: "node".into(),
            dir: default_bridge_dir(),
            env: vec![],
            secrets: vec![],
        },
    )
    .unwrap();
    let status = provider.exit_status(Some(127), b"bash: x: command not found\n");
    match status {
        ExitStatus::Unknown { reason } => {
            assert!(reason.contains("command not found"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        provider.exit_status(Some(3), b""),
        ExitStatus::Exited { code: 3 }
    );
    assert!(matches!(
        provider.exit_status(None, b""),
        ExitStatus::Unknown { .. }
    ));
    assert!(matches!(
        provider.exit_status(Some(-1), b""),
        ExitStatus::Unknown { .. }
    ));
}

#[test]
fn only_bridged_vendors_construct() {
    assert!(vendor("computesdk:e2b").is_some());
    assert!(vendor("e2b").is_none());
    assert!(vendor("computesdk:../x").is_none());
    let config = BridgeConfig {
        node: "node".into(),
        dir: default_bridge_dir(),
        env: vec![],
        secrets: vec![],
    };
    let err = new("computesdk:nope", config).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Setup);
}

#[test]
fn masking_covers_known_values_and_token_shapes() {
    let secrets = vec!["e2b_canary_0123456789abcdef".to_owned()];
    let text = "key e2b_canary_0123456789abcdef rejected; also sk-abcdefghijklmnopqrstuvwx";
    let masked = mask(text, &secrets);
    assert!(!masked.contains("e2b_canary"), "{masked}");
    assert!(!masked.contains("sk-abcdefghijklmnop"), "{masked}");
}

#[test]
fn a_relative_cwd_is_entered_by_the_line_and_never_spliced_into_it() {
    let hostile = "repo'; touch /pwned; '";
    let mut env = BTreeMap::new();
    let (line, cwd) = with_cwd(
        &Command::Argv(vec!["ls".into(), "-la".into()]),
        Some(hostile),
        &mut env,
    );
    assert_eq!(line, "cd -- \"$BERTH_CWD\" || exit 1\nls -la");
    assert_eq!(cwd, None);
    assert_eq!(env.get("BERTH_CWD").map(String::as_str), Some(hostile));

    let mut env = BTreeMap::new();
    let (line, cwd) = with_cwd(&Command::Shell("pwd".into()), Some("/abs"), &mut env);
    assert_eq!((line.as_str(), cwd.as_deref()), ("pwd", Some("/abs")));
    assert!(env.is_empty());
    let (line, cwd) = with_cwd(&Command::Shell("pwd".into()), None, &mut env);
    assert_eq!((line.as_str(), cwd), ("pwd", None));
}
