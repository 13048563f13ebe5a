//! Registration: a mission file read and checked, its paths confined, its repository bundled
//! and its initial record stored — everything checked before anything is written.

use super::*;

/// Reads a mission file: a regular file of at most [`berth_mission::file::MAX_FILE_BYTES`]
/// (a FIFO, device or directory is refused without blocking).
fn read_mission_file(path: &Path) -> Result<String, OrchestratorError> {
    let shown = path.display();
    let fail = |why: String| OrchestratorError::Unreadable(format!("cannot read {shown}: {why}"));
    let bytes = berth_files::read_regular(path, berth_mission::file::MAX_FILE_BYTES).map_err(
        |e| match e {
            berth_files::ReadError::TooLarge { max } => fail(format!(
                "larger than {max} bytes, the limit for mission files"
            )),
            other => fail(other.to_string()),
        },
    )?;
    String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))
}

/// The repository directory a mission file names, resolved (symlinks followed) and — unless
/// `allow_outside` — required to be the mission file's directory or beneath it.
fn confined_path(
    file_path: &Path,
    path: &str,
    allow_outside: bool,
) -> Result<PathBuf, OrchestratorError> {
    let resolved = confined(file_path, path, allow_outside, "repository.path")?;
    if !resolved.is_dir() {
        return Err(OrchestratorError::Repository(format!(
            "{} is not a directory",
            resolved.display()
        )));
    }
    Ok(resolved)
}

/// A path a mission file names (`field`), resolved (symlinks followed) and — unless
/// `allow_outside` — required to be the mission file's directory or beneath it.
fn confined(
    file_path: &Path,
    path: &str,
    allow_outside: bool,
    field: &str,
) -> Result<PathBuf, OrchestratorError> {
    let base = file_path.parent().unwrap_or(Path::new("."));
    let base = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    let shown = |e: std::io::Error, what: &Path| {
        OrchestratorError::Repository(format!("cannot resolve {}: {e}", what.display()))
    };
    let joined = base.join(path);
    let resolved = joined.canonicalize().map_err(|e| shown(e, &joined))?;
    let root = base.canonicalize().map_err(|e| shown(e, base))?;
    if !allow_outside && !resolved.starts_with(&root) {
        return Err(OrchestratorError::Unreadable(format!(
            "{field} `{}` resolves to {}, outside the mission file's directory {}; \
             a mission reads only what it ships with unless you pass --allow-outside-path",
            path.escape_debug(),
            resolved.display(),
            root.display()
        )));
    }
    Ok(resolved)
}

fn new_mission_id(name: &str) -> String {
    let mut buf = [0u8; 4];
    getrandom::fill(&mut buf).expect("OS randomness");
    format!("ms-{name}-{}", hex::encode(buf))
}

impl Orchestrator<'_> {
    /// Registers a mission from its file: resolves the base commit, bundles the repository,
    /// and records the initial state. Nothing runs yet.
    ///
    /// Every field is checked (including that each provider exists in this build) before
    /// anything is written; a registration that fails leaves no directory behind.
    pub async fn create(&self, file_path: &Path) -> Result<String, OrchestratorError> {
        self.create_with(file_path, false).await
    }

    /// [`Orchestrator::create`], where `allow_outside` lets `repository.path` name a directory
    /// outside the mission file's own (by default it must resolve, symlinks followed, to the
    /// mission file's directory or beneath it: a mission file reads only what it ships with).
    pub async fn create_with(
        &self,
        file_path: &Path,
        allow_outside: bool,
    ) -> Result<String, OrchestratorError> {
        let text = read_mission_file(file_path)?;
        let file = berth_mission::file::parse(&file_path.display().to_string(), &text)?;
        for provider in std::iter::once(&file.sandbox.provider).chain(&file.sandbox.fallback) {
            if !self.registry.has_adapter(provider) {
                return Err(OrchestratorError::UnknownProvider(provider.clone()));
            }
        }
        let model_script = agents::register_check(&file, self.registry, self.home, |path| {
            let path = confined(file_path, path, allow_outside, "harness.gateway.script")?;
            read_mission_file(&path)
        })?;
        let id = new_mission_id(&file.name);
        let dir = self.mission_dir(&id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                OrchestratorError::Repository(format!("cannot create {}: {e}", dir.display()))
            })?;
        let registered = self
            .register(file_path, file, model_script, &id, &dir, allow_outside)
            .await;
        if registered.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        registered
    }

    async fn register(
        &self,
        file_path: &Path,
        file: berth_mission::file::MissionFile,
        model_script: Option<String>,
        id: &str,
        dir: &Path,
        allow_outside: bool,
    ) -> Result<String, OrchestratorError> {
        let (id, dir) = (id.to_owned(), dir.to_owned());
        let mut source = match (&file.repository.path, &file.repository.url) {
            (Some(path), _) => confined_path(file_path, path, allow_outside)?,
            // A URL is cloned once, when the mission is registered; attempts never touch it.
            (None, Some(url)) => {
                if file.repository.base == "snapshot" {
                    return Err(OrchestratorError::Unsupported(
                        "base = \"snapshot\" with a git URL; name a commit, branch or tag".into(),
                    ));
                }
                let scheme = scheme_of(url).ok_or_else(|| {
                    OrchestratorError::Unsupported(format!(
                        "repository URL `{url}`: missions fetch over file://, https://, http://, \
                         ssh:// (or user@host:path) and git:// only"
                    ))
                })?;
                let clone = dir.join("clone");
                git_over(
                    &dir,
                    Transport::Scheme(scheme),
                    &[
                        "clone",
                        "--quiet",
                        "--mirror",
                        "--",
                        url,
                        &clone.to_string_lossy(),
                    ],
                )?;
                clone
            }
            (None, None) => unreachable!("validated"),
        };
        // `base = "snapshot"`: the directory's current files become the base commit of a fresh
        // repository (for plain directories and examples). Otherwise the path's repository is
        // mirrored into one Berth owns first: Berth's git never runs in a user's repository.
        if file.repository.base != "snapshot" && file.repository.path.is_some() {
            let mirror = dir.join("clone");
            git_over(
                &dir,
                Transport::Scheme("file"),
                &[
                    "clone",
                    "--quiet",
                    "--mirror",
                    "--no-local",
                    "--",
                    &source.to_string_lossy(),
                    &mirror.to_string_lossy(),
                ],
            )?;
            source = mirror;
        }
        if file.repository.base == "snapshot" {
            let copy = dir.join("source");
            copy_tree(&source, &copy).map_err(|e| {
                OrchestratorError::Repository(format!("cannot copy {}: {e}", source.display()))
            })?;
            git(&copy, &["init", "-q", "-b", "main"])?;
            git(&copy, &["add", "-A"])?;
            git(
                &copy,
                &[
                    "-c",
                    "user.name=berth",
                    "-c",
                    "user.email=berth@localhost",
                    "commit",
                    "-q",
                    "-m",
                    "berth: mission base",
                ],
            )?;
            source = copy;
        }
        let base = if file.repository.base == "snapshot" {
            "HEAD"
        } else {
            file.repository.base.as_str()
        };
        let base_commit = git(
            &source,
            &["rev-parse", "--verify", &format!("{base}^{{commit}}")],
        )?;
        // The base commit and its history, as the bundle's only ref (`HEAD`): a sandbox gets a
        // checkout of it, never the source's other branches, and a clone makes no branch of
        // its own (each one cost a staging about 4 ms). `source` is Berth's own repository.
        if base != "HEAD" {
            git(&source, &["update-ref", "--no-deref", "HEAD", &base_commit])?;
        }
        let base_bundle = dir.join("base.bundle");
        git(
            &source,
            &[
                "bundle",
                "create",
                "-q",
                &base_bundle.to_string_lossy(),
                "HEAD",
            ],
        )?;
        // The mission's own repository, where attempts are committed on the host.
        capture::work_repo(&dir, &base_bundle)?;
        let record = MissionRecord::new(
            &id,
            file.tasks
                .iter()
                .map(|t| (t.id.clone(), t.max_attempts, t.validator.evidence.clone()))
                .collect(),
        );
        let spec = MissionSpec {
            spec_version: SPEC_VERSION,
            file,
            base_commit,
            base_bundle,
            model_script,
        };
        self.store
            .mission_insert(
                &id,
                &spec.file.name,
                self.ledger.owner(),
                &serde_json::to_string(&spec).expect("spec serializes"),
                &serde_json::to_string(&record).expect("record serializes"),
                state_name(&record.state),
            )
            .await?;
        Ok(id)
    }
}
