use super::*;

fn store(dir: &std::path::Path, owner: &str) -> SessionStore {
    SessionStore::new(Objects::local(dir).unwrap(), owner)
}

/// A session record as `tar -c` writes one: parents first.
fn record_archive(text: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    builder
        .append_data(&mut dir.clone(), "./.codex", std::io::empty())
        .unwrap();
    builder
        .append_data(&mut dir, "./.codex/sessions", std::io::empty())
        .unwrap();
    let mut file = tar::Header::new_gnu();
    file.set_mode(0o600);
    file.set_size(text.len() as u64);
    builder
        .append_data(&mut file, "./.codex/sessions/rollout.jsonl", text)
        .unwrap();
    builder.into_inner().unwrap()
}

fn turn(n: u64) -> SessionTurn {
    SessionTurn {
        turn: n,
        at: Utc::now(),
        sandbox: "sb".into(),
        provider: "host".into(),
        cwd: ".".into(),
        exit: "exit 0".into(),
        rejected: None,
        tool_calls: 1,
        logs: "/logs".into(),
    }
}

fn first(id: &str) -> AgentSession {
    AgentSession {
        schema: SESSION_SCHEMA.into(),
        id: id.into(),
        origin: "prompt".into(),
        harness: "codex".into(),
        cli_session: "cli-1".into(),
        model: "scripted".into(),
        created_at: Utc::now(),
        updated_at: Utc::now(),
        turns: 1,
        history: vec![turn(1)],
        forked_from: None,
        archive_sha256: String::new(),
        archive_bytes: 0,
        not_carried: Vec::new(),
    }
}

#[tokio::test]
async fn a_turn_is_saved_read_back_and_the_previous_archive_goes() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = store(dir.path(), "alice");
    let id = SessionStore::new_id();
    let archive = SessionArchive::read(&record_archive(b"turn one")).unwrap();
    assert_eq!(archive.files, 1);
    let (saved, how) = sessions.save(first(&id), archive, None).await.unwrap();
    assert_eq!(how, Saved::Advanced);
    let (read, bytes) = sessions.get(&id).await.unwrap();
    assert_eq!(read, saved);
    let mut unpacked = tar::Archive::new(bytes.as_slice());
    let names: Vec<String> = unpacked
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(
        names,
        [".codex", ".codex/sessions", ".codex/sessions/rollout.jsonl"]
    );

    // The next turn replaces the record and removes the archive it no longer names.
    let mut next = read.clone();
    next.turns = 2;
    next.history.push(turn(2));
    let archive = SessionArchive::read(&record_archive(b"turn one, turn two")).unwrap();
    let (advanced, how) = sessions.save(next, archive, Some(&read)).await.unwrap();
    assert_eq!(how, Saved::Advanced);
    assert_eq!(advanced.id, id);
    // The record, its archive and the claim of its turn.
    let stored = sessions.objects.listed(&sessions.prefix).await.unwrap();
    assert_eq!(stored.len(), 3, "{stored:?}");
    assert!(stored[2].0.ends_with(".turn-00000002.claim"), "{stored:?}");
    assert_eq!(
        sessions.list().await.unwrap(),
        std::slice::from_ref(&advanced)
    );

    // Another owner sees none of it.
    let other = store(dir.path(), "mallory");
    assert!(matches!(
        other.get(&id).await,
        Err(PortableError::NoSession { .. })
    ));
    assert!(other.list().await.unwrap().is_empty());

    assert!(sessions.delete(&id).await.unwrap());
    assert!(sessions
        .objects
        .listed(&sessions.prefix)
        .await
        .unwrap()
        .is_empty());
    assert!(!sessions.delete(&id).await.unwrap());
    // Nothing is left in the local store, not even an empty directory of the session.
    let left: Vec<_> = std::fs::read_dir(dir.path().join(&sessions.prefix))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// Two turns resumed from the same record: the second to finish does not overwrite the first,
/// it becomes a fork.
#[tokio::test]
async fn a_turn_whose_session_moved_on_meanwhile_is_kept_as_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = store(dir.path(), "alice");
    let id = SessionStore::new_id();
    let archive = SessionArchive::read(&record_archive(b"one")).unwrap();
    let (started, _) = sessions.save(first(&id), archive, None).await.unwrap();
    let mut a = started.clone();
    a.turns = 2;
    let mut b = started.clone();
    b.turns = 2;
    let one = SessionArchive::read(&record_archive(b"a")).unwrap();
    let (a, how) = sessions.save(a, one, Some(&started)).await.unwrap();
    assert_eq!(how, Saved::Advanced);
    let two = SessionArchive::read(&record_archive(b"b")).unwrap();
    let (b, how) = sessions.save(b, two, Some(&started)).await.unwrap();
    assert!(
        matches!(how, Saved::Forked { ref from, .. } if *from == id),
        "{how:?}"
    );
    assert_ne!(b.id, id);
    assert_eq!(b.forked_from.as_deref(), Some(id.as_str()));
    assert_eq!(sessions.record(&id).await.unwrap(), a);
    assert_eq!(sessions.list().await.unwrap().len(), 2);
}

/// Two turns resumed from the same record and saved at the same moment (both read the record
/// before either writes): exactly one goes on, the other is a fork.
#[tokio::test]
async fn turns_saved_at_the_same_moment_never_overwrite_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = store(dir.path(), "alice");
    let id = SessionStore::new_id();
    let archive = SessionArchive::read(&record_archive(b"one")).unwrap();
    let (started, _) = sessions.save(first(&id), archive, None).await.unwrap();
    for round in 0..20 {
        let current = sessions.record(&id).await.unwrap();
        let next = |text: &'static [u8]| {
            let mut turn = current.clone();
            turn.turns += 1;
            (turn, SessionArchive::read(&record_archive(text)).unwrap())
        };
        let ((a, a_archive), (b, b_archive)) = (next(b"a"), next(b"b"));
        let (a, b) = tokio::join!(
            sessions.save(a, a_archive, Some(&current)),
            sessions.save(b, b_archive, Some(&current)),
        );
        let outcomes = [a.unwrap().1, b.unwrap().1];
        let advanced = outcomes.iter().filter(|s| **s == Saved::Advanced).count();
        assert_eq!(advanced, 1, "round {round}: {outcomes:?}");
        assert_eq!(sessions.record(&id).await.unwrap().turns, current.turns + 1);
        sessions.get(&id).await.unwrap();
    }
    assert_eq!(started.turns, 1);
}

#[tokio::test]
async fn hostile_ids_records_and_archives_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = store(dir.path(), "alice");
    for id in [
        "as-../../etc/passwd",
        "as-",
        "as-ABCDEF0123456789ABCDEF0123456789",
        "ws-00000000000000000000000000000000",
    ] {
        assert!(
            matches!(sessions.get(id).await, Err(PortableError::NoSession { .. })),
            "{id}"
        );
    }
    // An archive a sandbox wrote with a path escaping, or a file through a link: refused.
    let mut escaping = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_mode(0o644);
    h.as_gnu_mut().unwrap().name[..10].copy_from_slice(b"../x/evil1");
    h.set_cksum();
    escaping.append(&h, &b"x"[..]).unwrap();
    let err = SessionArchive::read(&escaping.into_inner().unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the agent's session record is refused: "),
        "{err}"
    );

    // A link in a session record: refused (the next run's CLI would write through it).
    let mut linked = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    linked
        .append_data(&mut dir, "./.codex", std::io::empty())
        .unwrap();
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    linked
        .append_link(&mut link, "./.codex/sessions", "/root/.ssh")
        .unwrap();
    let err = SessionArchive::read(&linked.into_inner().unwrap()).unwrap_err();
    assert!(err.to_string().contains("is a symbolic link"), "{err}");

    // A CLI conversation id that would be an option, or is no plain id: never kept.
    for cli in ["-c model=x", "--help", "a b", "x;y", "", &"a".repeat(129)] {
        let mut bad = first(&SessionStore::new_id());
        bad.cli_session = cli.to_owned();
        let archive = SessionArchive::read(&record_archive(b"one")).unwrap();
        let err = sessions.save(bad, archive, None).await.unwrap_err();
        assert!(err.to_string().contains("not a plain id"), "{cli}: {err}");
    }
    for cli in [
        "01a24ecb-6b7f-7ee0-8a85-0d2ace7562ba",
        "ses_db13449feffeHpUs77mAfcEjs6",
    ] {
        assert!(plain_cli_session(cli), "{cli}");
    }
    assert!(sessions.list().await.unwrap().is_empty());

    // A stored archive replaced behind the record's back: refused on read.
    let id = SessionStore::new_id();
    let archive = SessionArchive::read(&record_archive(b"one")).unwrap();
    let (saved, _) = sessions.save(first(&id), archive, None).await.unwrap();
    let key = sessions.archive_key(SessionStore::hex_of(&id).unwrap(), &saved.archive_sha256);
    sessions
        .objects
        .put_overwrite(&key, record_archive(b"swapped").into())
        .await
        .unwrap();
    let err = sessions.get(&id).await.unwrap_err();
    assert!(err.to_string().contains("another archive"), "{err}");
    // A record of another session under this id: refused.
    let mut other = saved.clone();
    other.id = SessionStore::new_id();
    sessions
        .objects
        .put_overwrite(
            &sessions.record_key(SessionStore::hex_of(&id).unwrap()),
            serde_json::to_vec(&other).unwrap().into(),
        )
        .await
        .unwrap();
    let err = sessions.record(&id).await.unwrap_err();
    assert!(
        err.to_string().contains("not a record of this session"),
        "{err}"
    );
    // A record whose CLI conversation id would be an option: refused the same way.
    let mut optioned = saved.clone();
    optioned.cli_session = "--dangerously-bypass".into();
    sessions
        .objects
        .put_overwrite(
            &sessions.record_key(SessionStore::hex_of(&id).unwrap()),
            serde_json::to_vec(&optioned).unwrap().into(),
        )
        .await
        .unwrap();
    let err = sessions.get(&id).await.unwrap_err();
    assert!(
        err.to_string().contains("not a record of this session"),
        "{err}"
    );
}

/// What a crash left (an archive no record names) goes once it is old; the archive a record
/// names, and a young one a turn may be saving, stay.
#[tokio::test]
async fn gc_takes_archives_no_record_names_once_old() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = store(dir.path(), "alice");
    let id = SessionStore::new_id();
    let archive = SessionArchive::read(&record_archive(b"one")).unwrap();
    let (saved, _) = sessions.save(first(&id), archive, None).await.unwrap();
    let hex = SessionStore::hex_of(&id).unwrap().to_owned();
    let stray = sessions.archive_key(&hex, &"a".repeat(64));
    let unrecorded_id = SessionStore::new_id();
    let unrecorded = sessions.archive_key(
        SessionStore::hex_of(&unrecorded_id).unwrap(),
        &"b".repeat(64),
    );
    let young = sessions.archive_key(&hex, &"c".repeat(64));
    let claim = sessions.claim_key(&hex, 2);
    for key in [&stray, &unrecorded, &young, &claim] {
        sessions
            .objects
            .put_overwrite(key, record_archive(b"x").into())
            .await
            .unwrap();
    }
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
    for key in [&stray, &unrecorded, &claim] {
        std::fs::File::options()
            .write(true)
            .open(dir.path().join(key))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let named = sessions.archive_key(&hex, &saved.archive_sha256);
    std::fs::File::options()
        .write(true)
        .open(dir.path().join(&named))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let collected = sessions.gc().await.unwrap();
    let mut names: Vec<&str> = collected.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    let mut expected = vec![
        format!("{id}.{}.tar", "a".repeat(64)),
        format!("{unrecorded_id}.{}.tar", "b".repeat(64)),
        format!("{id}.turn-00000002.claim"),
    ];
    expected.sort();
    assert_eq!(names, expected);
    let left: Vec<String> = sessions
        .objects
        .listed(&sessions.prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(left.contains(&named) && left.contains(&young), "{left:?}");
    assert_eq!(left.len(), 3, "{left:?}");
    sessions.get(&id).await.unwrap();
}

/// A delete while a turn of the session is being saved: the turn that had claimed its number
/// is waited for and deleted with the rest — the session does not come back — and a turn that
/// claims after the delete is kept as a fork. Before, the delete removed the record under the
/// saving turn, which then wrote it again: a deleted session came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_while_a_turn_is_saved_stays_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = std::sync::Arc::new(store(dir.path(), "alice"));
    let id = SessionStore::new_id();
    let archive = || SessionArchive::read(&record_archive(b"turn")).unwrap();
    let (started, _) = sessions.save(first(&id), archive(), None).await.unwrap();

    // A turn that has claimed its number and stops there until told to go on.
    let (claimed_tx, claimed_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let saving = {
        let sessions = sessions.clone();
        let started = started.clone();
        let mut next = started.clone();
        next.turns = 2;
        next.history.push(turn(2));
        let go = std::sync::Mutex::new(go_rx);
        tokio::spawn(async move {
            let mut on_step = move |step: SaveStep| {
                if step == SaveStep::Claimed {
                    claimed_tx.send(()).unwrap();
                    go.lock().unwrap().recv().unwrap();
                }
            };
            sessions
                .save_observed(next, archive(), Some(&started), None, &mut on_step)
                .await
        })
    };
    tokio::task::spawn_blocking(move || claimed_rx.recv().unwrap())
        .await
        .unwrap();
    let deleting = {
        let sessions = sessions.clone();
        let id = id.clone();
        tokio::spawn(async move { sessions.delete(&id).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !deleting.is_finished(),
        "the delete waits for the claimed turn"
    );
    go_tx.send(()).unwrap();
    let (_, how) = saving.await.unwrap().unwrap();
    assert_eq!(how, Saved::Advanced);
    assert!(deleting.await.unwrap().unwrap());
    assert!(matches!(
        sessions.get(&id).await,
        Err(PortableError::NoSession { .. })
    ));
    assert!(sessions
        .objects
        .listed(&sessions.prefix)
        .await
        .unwrap()
        .is_empty());

    // A turn resumed before the delete and saved after it: kept as a fork, the deleted one
    // stays gone.
    let mut late = started.clone();
    late.turns = 2;
    late.history.push(turn(2));
    let (kept, how) = sessions
        .save(late, archive(), Some(&started))
        .await
        .unwrap();
    assert!(matches!(how, Saved::Forked { .. }), "{how:?}");
    assert_ne!(kept.id, id);
    assert!(sessions.get(&id).await.is_err());
}

/// A claim a killed save left (over two minutes old) does not block a delete; a fresh one
/// makes it wait, and past its wait it is refused (busy), deleting nothing.
#[tokio::test]
async fn a_delete_clears_a_stale_claim_and_refuses_under_a_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = store(dir.path(), "alice");
    let id = SessionStore::new_id();
    let archive = SessionArchive::read(&record_archive(b"turn")).unwrap();
    sessions.save(first(&id), archive, None).await.unwrap();
    let hex = SessionStore::hex_of(&id).unwrap().to_owned();
    let claim = sessions.claim_key(&hex, 2);
    assert!(sessions
        .objects
        .create_new(&claim, b"live".to_vec().into())
        .await
        .unwrap());
    let refused = sessions
        .delete_waiting(&id, std::time::Duration::from_millis(200))
        .await;
    assert!(
        matches!(refused, Err(PortableError::SessionBusy { turn: 2, .. })),
        "{refused:?}"
    );
    assert!(sessions.get(&id).await.is_ok(), "nothing was deleted");

    // The same claim, two minutes and more old: a killed save's.
    let file = dir.path().join(&claim);
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(180);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert!(sessions
        .delete_waiting(&id, std::time::Duration::from_millis(200))
        .await
        .unwrap());
    assert!(sessions.get(&id).await.is_err());
}

/// A run killed after claiming its turn saves again (its recovery, naming the same run): its
/// own claim lets it go on; another run finding that claim is a fork.
#[tokio::test]
async fn a_run_saving_again_after_a_kill_finds_its_own_claim() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = store(dir.path(), "alice");
    let id = SessionStore::new_id();
    let archive = SessionArchive::read(&record_archive(b"one")).unwrap();
    let (started, _) = sessions.save(first(&id), archive, None).await.unwrap();
    let mut next = started.clone();
    next.turns = 2;
    // Killed once the claim was made (a panic ends the save there).
    let killed = tokio::spawn({
        let (sessions, next, started) = (sessions.clone(), next.clone(), started.clone());
        async move {
            sessions
                .save_observed(
                    next,
                    SessionArchive::read(&record_archive(b"two")).unwrap(),
                    Some(&started),
                    Some("1-aaaa"),
                    &mut |step| assert_ne!(step, SaveStep::Claimed, "killed"),
                )
                .await
        }
    });
    assert!(killed.await.is_err());
    assert_eq!(sessions.record(&id).await.unwrap(), started);
    // Another run: a fork.
    let (other, how) = sessions
        .save_observed(
            next.clone(),
            SessionArchive::read(&record_archive(b"other")).unwrap(),
            Some(&started),
            Some("2-bbbb"),
            &mut |_| {},
        )
        .await
        .unwrap();
    assert!(matches!(how, Saved::Forked { .. }), "{how:?}");
    assert_ne!(other.id, id);
    // The same run again: it goes on.
    let (again, how) = sessions
        .save_observed(
            next,
            SessionArchive::read(&record_archive(b"two")).unwrap(),
            Some(&started),
            Some("1-aaaa"),
            &mut |_| {},
        )
        .await
        .unwrap();
    assert_eq!(how, Saved::Advanced);
    assert_eq!((again.id.as_str(), again.turns), (id.as_str(), 2));
}
