//! Each attempt's artifact bundle: gathered from what the mission keeps on the host (the
//! attempt's logs, its patch and git bundle, its trajectory, its facts), redacted and
//! published through `berth-artifacts`. An accepted attempt finalizes only once its bundle is
//! indexed; a rejected one publishes on a best-effort basis (an interrupted claim is left for
//! `berth artifacts reconcile`).

use std::path::Path;

use berth_artifacts::{build, publish, BundleFile, BundleInput, Lifecycle, Objects, Redactor};
use berth_harness::Harness;
use berth_mission::authority::{AttemptKey, AttemptRecord};
use berth_mission::file::Task;

use crate::pipeline::{attempt_bundle, attempt_ref};
use crate::{MissionSpec, Orchestrator, OrchestratorError};

/// The variable naming an S3-compatible bucket for bundles (`s3://BUCKET[/PREFIX]`); unset,
/// bundles go to `$BERTH_HOME/artifacts`.
pub const ARTIFACTS_URL_VAR: &str = "BERTH_ARTIFACTS_URL";
/// Its endpoint, when not AWS (`http://127.0.0.1:8333`).
pub const ARTIFACTS_ENDPOINT_VAR: &str = "BERTH_ARTIFACTS_ENDPOINT";
/// Its region (default `us-east-1`).
pub const ARTIFACTS_REGION_VAR: &str = "BERTH_ARTIFACTS_REGION";
/// The NAME of the variable holding the access key id (default `AWS_ACCESS_KEY_ID`).
pub const ARTIFACTS_KEY_ID_NAME_VAR: &str = "BERTH_ARTIFACTS_KEY_ID_VAR";
/// The NAME of the variable holding the secret key (default `AWS_SECRET_ACCESS_KEY`).
pub const ARTIFACTS_SECRET_NAME_VAR: &str = "BERTH_ARTIFACTS_SECRET_VAR";

/// Where bundles' objects live: the S3-compatible bucket [`ARTIFACTS_URL_VAR`] names, else
/// `$BERTH_HOME/artifacts`.
pub fn objects(
    home: &Path,
    env: &berth_factory::Environment,
) -> Result<Objects, OrchestratorError> {
    let Some(url) = env.get(ARTIFACTS_URL_VAR).filter(|u| !u.is_empty()) else {
        let dir = home.join("artifacts");
        return Objects::local(&dir).map_err(|e| OrchestratorError::ArtifactDir(e.to_string()));
    };
    let named = |var: &str, default: &str| -> Result<String, OrchestratorError> {
        let name = env.get(var).filter(|n| !n.is_empty()).unwrap_or(default);
        env.get(name)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| OrchestratorError::ArtifactCredential {
                variable: name.to_owned(),
            })
    };
    Objects::s3(&berth_artifacts::S3Config {
        url: url.to_owned(),
        endpoint: env
            .get(ARTIFACTS_ENDPOINT_VAR)
            .filter(|e| !e.is_empty())
            .map(str::to_owned),
        region: env
            .get(ARTIFACTS_REGION_VAR)
            .filter(|r| !r.is_empty())
            .unwrap_or("us-east-1")
            .to_owned(),
        access_key_id: named(ARTIFACTS_KEY_ID_NAME_VAR, "AWS_ACCESS_KEY_ID")?,
        secret_access_key: named(ARTIFACTS_SECRET_NAME_VAR, "AWS_SECRET_ACCESS_KEY")?,
    })
    .map_err(|e| OrchestratorError::ArtifactConfig(e.to_string()))
}

/// Publication steps taken by this process (for [`crate::Boundary::Publication`]).
static STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Most of one log file a bundle takes.
const MAX_LOG_BYTES: u64 = 64 << 20;

fn mime_of(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("jsonl") => "application/x-ndjson",
        Some("json") => "application/json",
        Some("tar") => "application/x-tar",
        Some("bundle") => "application/x-git-bundle",
        Some("diff") => "text/x-diff",
        _ => "text/plain",
    }
}

/// The scanner for everything of this mission's that becomes durable (agent logs, validator
/// output in the store, session records, bundles): the secret values it was handed
/// ([`known_secrets`]), and token shapes.
pub(crate) fn redactor(orch: &Orchestrator<'_>, spec: &MissionSpec) -> Redactor {
    Redactor::new(mission_secrets(&orch.config.env, orch.home, spec))
}

/// A mission's [`known_secrets`] (its gateway's credential, its login), read now.
pub fn mission_secrets(
    env: &berth_factory::Environment,
    home: &Path,
    spec: &MissionSpec,
) -> Vec<String> {
    let credential_env = spec
        .file
        .harness
        .gateway
        .as_ref()
        .and_then(|g| g.credential_env.as_deref());
    let login = spec
        .file
        .harness
        .login
        .as_deref()
        .zip(Harness::parse(&spec.file.harness.kind));
    known_secrets(env, home, credential_env, login)
}

/// The known secret values of a run (masked wherever they appear): the artifact store's S3
/// credentials, the value of the gateway's `credential_env`, and the strings of a subscription
/// login (`login`: its name in `$BERTH_HOME/logins.toml` and its harness).
pub fn known_secrets(
    env: &berth_factory::Environment,
    home: &Path,
    credential_env: Option<&str>,
    login: Option<(&str, Harness)>,
) -> Vec<String> {
    let mut found = Vec::new();
    // The artifact store's own credentials, when it is S3.
    for (var, default) in [
        (ARTIFACTS_KEY_ID_NAME_VAR, "AWS_ACCESS_KEY_ID"),
        (ARTIFACTS_SECRET_NAME_VAR, "AWS_SECRET_ACCESS_KEY"),
    ] {
        let name = env.get(var).filter(|n| !n.is_empty()).unwrap_or(default);
        if let Some(value) = env.get(name) {
            found.push(value.to_owned());
        }
    }
    if let Some(value) = credential_env.and_then(|variable| env.get(variable)) {
        found.push(value.to_owned());
    }
    if let Some((name, harness)) = login {
        if let Ok(login) = crate::logins::find(home, name, harness) {
            // The login's bytes, bounded and never a FIFO (its values are masked wherever the
            // attempt's files are published).
            let read =
                berth_files::read_regular(&login.file, crate::logins::MAX_LOGIN_BYTES as u64);
            if let Ok(text) = read {
                found.extend(login_strings(&text));
            }
        }
    }
    found
}

/// The secret values of a login file's bytes: its JSON strings of 16 characters or more.
pub(crate) fn login_strings(bytes: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
        collect_strings(&value, &mut found);
    }
    found
}

fn collect_strings(value: &serde_json::Value, into: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) if s.len() >= 16 => into.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_strings(v, into)),
        serde_json::Value::Object(map) => map.values().for_each(|v| collect_strings(v, into)),
        _ => {}
    }
}

/// A regular file Berth wrote under the mission directory (never a link), bounded: its first
/// [`MAX_LOG_BYTES`], and its whole size when that was more.
fn read_bounded(path: &Path) -> Option<(Vec<u8>, Option<u64>)> {
    use std::io::Read;
    if !std::fs::symlink_metadata(path).ok()?.file_type().is_file() {
        return None;
    }
    let file = std::fs::File::open(path).ok()?;
    let size = file.metadata().ok()?.len();
    let mut bytes = Vec::new();
    file.take(MAX_LOG_BYTES).read_to_end(&mut bytes).ok()?;
    let truncated_from = (size > bytes.len() as u64).then_some(size);
    Some((bytes, truncated_from))
}

/// The attempt's patch against the mission's base: the one made at capture, or — for an
/// attempt captured before patches were kept, or whose file a crash took — `git diff` now.
fn patch(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    mission: &str,
    task: &Task,
    attempt: &AttemptRecord,
    commit: &str,
) -> Result<Vec<u8>, OrchestratorError> {
    let kept = crate::pipeline::attempt_patch(orch, mission, task, attempt.ordinal, commit);
    if std::fs::symlink_metadata(&kept).is_ok_and(|m| m.file_type().is_file()) {
        if let Ok(bytes) = std::fs::read(&kept) {
            return Ok(bytes);
        }
    }
    let repo = crate::capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
    crate::capture::start_patch(&repo, &spec.base_commit, &attempt_ref(&attempt.key))?.finish()
}

/// Token usage summed from the gateway's journal (`None`: no journal or no usage reported).
fn usage(journal: &Path) -> Option<serde_json::Value> {
    let entries = berth_gateway::Journal::read(journal).ok()?;
    let (mut input, mut output, mut cached, mut seen) = (0u64, 0u64, 0u64, false);
    for usage in entries.iter().filter_map(|e| e.usage.as_ref()) {
        seen = true;
        input += usage.input;
        output += usage.output;
        cached += usage.cached;
    }
    seen.then(|| {
        serde_json::json!({
            "input_tokens": input, "output_tokens": output, "cached_input_tokens": cached,
            "requests": entries.len(),
        })
    })
}

/// Everything the bundle of `attempt` holds.
#[allow(clippy::too_many_arguments)] // the attempt's coordinates travel together
async fn gather(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    mission: &str,
    task: &Task,
    attempt: &AttemptRecord,
    lifecycle: Lifecycle,
) -> Result<BundleInput, OrchestratorError> {
    let (mut files, mut withheld) = (Vec::new(), Vec::new());
    let dir = orch.mission_dir(mission);
    // The patch and the git bundle of the captured commit, when there is one.
    if let Some(commit) = &lifecycle.commit {
        files.push(BundleFile {
            path: "patch.diff".into(),
            mime: "text/x-diff".into(),
            bytes: patch(orch, spec, mission, task, attempt, commit)?,
            opaque: false,
            truncated_from: None,
        });
        let bundle = attempt_bundle(orch, mission, task, attempt.ordinal);
        match read_bounded(&bundle) {
            Some((bytes, None)) => files.push(BundleFile {
                path: "repo.bundle".into(),
                mime: "application/x-git-bundle".into(),
                bytes,
                opaque: true,
                truncated_from: None,
            }),
            // Cut short, a git bundle is corrupt: left out, with the reason.
            Some((_, Some(size))) => withheld.push(berth_artifacts::bundle::Withheld {
                path: "repo.bundle".into(),
                reason: format!(
                    "{size} bytes, over the {MAX_LOG_BYTES}-byte limit (the patch and the \
                     mission's own bundle hold the commit)"
                ),
            }),
            None => {}
        }
    }
    // The agent's logs (agent CLIs).
    let logs = dir
        .join("attempts")
        .join(format!("{}-{}", task.id, attempt.ordinal));
    let mut names: Vec<String> = std::fs::read_dir(&logs)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for name in &names {
        // A log over the limit keeps its first bytes; the manifest gives its whole size.
        if let Some((bytes, truncated_from)) = read_bounded(&logs.join(name)) {
            files.push(BundleFile {
                path: format!("logs/{name}"),
                mime: mime_of(name).into(),
                bytes,
                opaque: false,
                truncated_from,
            });
        }
    }
    // The trajectory, when the agent did something.
    if let (Some(harness), Some((bytes, _))) = (
        Harness::parse(&spec.file.harness.kind),
        read_bounded(&logs.join("events.jsonl")),
    ) {
        let events: Vec<berth_harness::Event> = String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let model = spec.file.harness.model_name();
        if let Ok(trajectory) =
            berth_harness::atif::trajectory(harness, &task.instructions, Some(model), &events)
        {
            files.push(BundleFile {
                path: "trajectory.json".into(),
                mime: "application/json".into(),
                bytes: serde_json::to_vec_pretty(&trajectory).expect("trajectory serializes"),
                opaque: false,
                truncated_from: None,
            });
        }
    }
    // The attempt's durable facts (agent, validator, capture, …), as the store holds them.
    let facts: Vec<serde_json::Value> = orch
        .store
        .attempt_facts(mission)
        .await?
        .into_iter()
        .filter(|f| f.attempt_key == attempt.key.0)
        .map(|f| {
            serde_json::json!({
                "kind": f.kind,
                "detail": serde_json::from_str::<serde_json::Value>(&f.detail_json)
                    .unwrap_or(serde_json::Value::String(f.detail_json)),
            })
        })
        .collect();
    files.push(BundleFile {
        path: "facts.json".into(),
        mime: "application/json".into(),
        bytes: serde_json::to_vec_pretty(&facts).expect("facts serialize"),
        opaque: false,
        truncated_from: None,
    });
    Ok(BundleInput {
        mission: mission.to_owned(),
        task: task.id.clone(),
        attempt_key: attempt.key.0.clone(),
        ordinal: attempt.ordinal,
        lifecycle,
        retention: "forever".into(),
        usage: usage(&logs.join("gateway.jsonl")),
        withheld,
        files,
    })
}

/// Builds and publishes `attempt`'s bundle; its id once indexed.
pub(crate) async fn publish_attempt(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    mission: &str,
    task: &Task,
    attempt: &AttemptRecord,
    lifecycle: Lifecycle,
) -> Result<(String, serde_json::Value), OrchestratorError> {
    let input = gather(orch, spec, mission, task, attempt, lifecycle).await?;
    let bundle = build(input, &redactor(orch, spec))
        .map_err(|e| OrchestratorError::Repository(format!("artifact bundle: {e}")))?;
    let objects = objects(orch.home, &orch.config.env)?;
    let hook = orch.boundary;
    let claim = publish(orch.ledger.store(), &objects, &bundle, &mut |_| {
        if let Some(hook) = hook {
            let n = STEPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            hook(crate::Boundary::Publication(n));
        }
    })
    .await
    .map_err(|e| {
        OrchestratorError::Repository(format!(
            "publishing bundle {} failed (the attempt does not finalize until it is \
                 indexed; resume, or `berth artifacts reconcile`): {e}",
            bundle.manifest.bundle_id
        ))
    })?;
    #[allow(unused_mut)]
    let mut detail = serde_json::json!({
        "bundle": claim.bundle_id,
        "files": bundle.manifest.files.len() + 1,
        "withheld": bundle.manifest.withheld,
        "redactions": bundle.manifest.redactions,
        "objects": objects.location,
    });
    #[cfg(feature = "iceberg")]
    {
        detail["iceberg"] = match sync_iceberg(orch.home, orch.ledger.store()).await {
            Ok(synced) => serde_json::json!({ "appended_rows": synced.rows }),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
    }
    Ok((claim.bundle_id, detail))
}

/// The Iceberg table's warehouse under `$BERTH_HOME`.
#[cfg(feature = "iceberg")]
pub const ICEBERG_WAREHOUSE: &str = "iceberg";

/// Appends every INDEXED bundle the Iceberg table lacks. Never part of the authoritative
/// transition (the store's index is): a failure is reported and the next sync catches up.
#[cfg(feature = "iceberg")]
pub async fn sync_iceberg(
    home: &Path,
    store: &dyn berth_store::ArtifactStore,
) -> Result<berth_artifacts::iceberg_index::Synced, berth_artifacts::ArtifactError> {
    berth_artifacts::iceberg_index::IcebergIndex::open(
        &home.join("berth.db"),
        &home.join(ICEBERG_WAREHOUSE),
    )
    .await?
    .sync(store)
    .await
}

/// Publishes a just-rejected attempt's bundle on a best-effort basis: a rejection does not
/// wait on the object store (an interrupted claim is left for `berth artifacts reconcile`).
pub(crate) async fn publish_rejected(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &berth_mission::authority::MissionRecord,
    key: &AttemptKey,
    reason: &str,
) {
    let found = record.tasks.iter().find_map(|t| {
        let attempt = t.attempts.iter().find(|a| &a.key == key)?;
        let task = spec.file.tasks.iter().find(|f| f.id == t.id)?;
        Some((task, attempt))
    });
    if let Some((task, attempt)) = found {
        let lifecycle = rejected(orch, spec, &record.id, key, reason);
        let _ = publish_attempt(orch, spec, &record.id, task, attempt, lifecycle).await;
    }
}

/// Publishes the bundle of every rejected attempt of `record` that has none indexed (a crash
/// interrupted it). Best effort, like the first try.
pub(crate) async fn republish_rejected(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &berth_mission::authority::MissionRecord,
) {
    use berth_mission::authority::AttemptStatus;
    use berth_store::{ArtifactQuery, ArtifactStore};
    for task in &record.tasks {
        for attempt in &task.attempts {
            let AttemptStatus::Rejected { reason } = &attempt.status else {
                continue;
            };
            let indexed = orch
                .ledger
                .store()
                .artifacts(&ArtifactQuery {
                    attempt_key: Some(attempt.key.0.clone()),
                    ..Default::default()
                })
                .await
                .is_ok_and(|rows| !rows.is_empty());
            if !indexed {
                publish_rejected(orch, spec, record, &attempt.key, reason).await;
            }
        }
    }
}

/// The lifecycle a rejected attempt's bundle records (its commit, when it was captured).
pub(crate) fn rejected(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    mission: &str,
    key: &AttemptKey,
    reason: &str,
) -> Lifecycle {
    let commit = crate::capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)
        .ok()
        .and_then(|repo| crate::capture::resolve(&repo, &attempt_ref(key)).ok());
    Lifecycle {
        outcome: "rejected".into(),
        reason: Some(reason.to_owned()),
        commit,
        base_commit: Some(spec.base_commit.clone()),
        checkpoint: None,
    }
}

/// The lifecycle an accepted attempt's bundle records.
pub(crate) fn accepted(spec: &MissionSpec, commit: &str, checkpoint: &str) -> Lifecycle {
    Lifecycle {
        outcome: "accepted".into(),
        reason: None,
        commit: Some(commit.to_owned()),
        base_commit: Some(spec.base_commit.clone()),
        checkpoint: Some(checkpoint.to_owned()),
    }
}
