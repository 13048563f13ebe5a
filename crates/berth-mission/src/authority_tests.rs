//! Unit and property tests of the authority.

use proptest::prelude::*;

use super::*;

fn inputs() -> AttemptInputs {
    AttemptInputs {
        provider: "host".into(),
        image: None,
        harness: "script/1".into(),
        validator: "sha256:v".into(),
    }
}

fn mission(max: u32) -> MissionRecord {
    MissionRecord::new(
        "m1",
        vec![
            ("first".into(), max, vec!["result.txt".into()]),
            ("second".into(), max, vec![]),
        ],
    )
}

fn start(m: &MissionRecord, task: &str) -> (MissionRecord, AttemptKey) {
    let m = apply(
        m,
        &Event::Start {
            task: task.into(),
            inputs: inputs(),
        },
    )
    .unwrap();
    let key = m.open_attempt().unwrap().key.clone();
    (m, key)
}

fn to_frozen(m: MissionRecord, key: &AttemptKey) -> MissionRecord {
    [
        Phase::SandboxReady,
        Phase::Staged,
        Phase::AgentStopped,
        Phase::Frozen,
    ]
    .into_iter()
    .fold(m, |m, phase| {
        apply(
            &m,
            &Event::Reached {
                key: key.clone(),
                phase,
            },
        )
        .unwrap()
    })
}

fn accept(m: MissionRecord, key: &AttemptKey, evidence: &[&str]) -> MissionRecord {
    let m = to_frozen(m, key);
    let m = apply(
        &m,
        &Event::ValidatorPassed {
            key: key.clone(),
            evidence: evidence.iter().map(|e| e.to_string()).collect(),
        },
    )
    .unwrap();
    let m = apply(
        &m,
        &Event::Committed {
            key: key.clone(),
            commit: "c0ffee".into(),
        },
    )
    .unwrap();
    let m = apply(
        &m,
        &Event::Checkpointed {
            key: key.clone(),
            checkpoint: "sha256:cp".into(),
        },
    )
    .unwrap();
    assert!(
        apply(&m, &Event::Finalized { key: key.clone() }).is_err(),
        "finalize before the bundle is indexed"
    );
    let m = apply(
        &m,
        &Event::Published {
            key: key.clone(),
            bundle: "bd-1".into(),
        },
    )
    .unwrap();
    assert!(
        apply(
            &m,
            &Event::Published {
                key: key.clone(),
                bundle: "bd-other".into(),
            },
        )
        .is_err(),
        "a second, different bundle"
    );
    apply(&m, &Event::Finalized { key: key.clone() }).unwrap()
}

#[test]
fn keys_are_deterministic_and_distinct() {
    assert_eq!(attempt_key("m", "t", 1), attempt_key("m", "t", 1));
    assert_ne!(attempt_key("m", "t", 1), attempt_key("m", "t", 2));
    assert_ne!(attempt_key("m", "t", 1), attempt_key("m", "u", 1));
    assert_ne!(
        attempt_key("m1", "t", 1),
        attempt_key("m", "1t", 1),
        "parts are delimited"
    );
}

#[test]
fn a_mission_runs_reject_then_accept_through_every_gate() {
    let m = mission(3);
    let (m, first) = start(&m, "first");
    assert_eq!(
        next(&m),
        Next::Continue {
            key: first.clone(),
            status: AttemptStatus::InProgress {
                phase: Phase::Claimed
            }
        }
    );
    let m = to_frozen(m, &first);
    let m = apply(
        &m,
        &Event::Rejected {
            key: first.clone(),
            reason: "tests fail".into(),
        },
    )
    .unwrap();
    assert_eq!(
        m.tasks[0].state,
        TaskState::Open,
        "a rejection keeps the gate on the task"
    );
    let (m, second) = start(&m, "first");
    assert_eq!(second, attempt_key("m1", "first", 2));
    let m = accept(m, &second, &["result.txt"]);
    assert_eq!(m.tasks[0].state, TaskState::Done { accepted: second });
    let (m, third) = start(&m, "second");
    let m = accept(m, &third, &[]);
    assert_eq!(m.state, MissionState::Succeeded);
    assert!(matches!(
        apply(&m, &Event::Finalized { key: third }),
        Err(AuthorityError::Finished(_))
    ));
}

#[test]
fn a_pass_without_declared_evidence_is_a_rejection() {
    let (m, key) = start(&mission(2), "first");
    let m = to_frozen(m, &key);
    let m = apply(
        &m,
        &Event::ValidatorPassed {
            key: key.clone(),
            evidence: vec![],
        },
    )
    .unwrap();
    match &m.tasks[0].attempts[0].status {
        AttemptStatus::Rejected { reason } => assert!(reason.contains("vacuous"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn gates_are_enforced_in_order() {
    let (m, key) = start(&mission(2), "first");
    // Validator before freeze.
    let early = apply(
        &m,
        &Event::ValidatorPassed {
            key: key.clone(),
            evidence: vec!["result.txt".into()],
        },
    );
    assert!(early.is_err());
    let m = to_frozen(m, &key);
    let m = apply(
        &m,
        &Event::ValidatorPassed {
            key: key.clone(),
            evidence: vec!["result.txt".into()],
        },
    )
    .unwrap();
    assert!(
        apply(
            &m,
            &Event::Checkpointed {
                key: key.clone(),
                checkpoint: "x".into()
            }
        )
        .is_err(),
        "checkpoint before commit"
    );
    assert!(
        apply(&m, &Event::Finalized { key: key.clone() }).is_err(),
        "finalize without commit"
    );
    let m = apply(
        &m,
        &Event::Committed {
            key: key.clone(),
            commit: "c1".into(),
        },
    )
    .unwrap();
    assert!(
        apply(&m, &Event::Finalized { key: key.clone() }).is_err(),
        "finalize without checkpoint"
    );
    assert!(
        apply(
            &m,
            &Event::Committed {
                key: key.clone(),
                commit: "c2".into()
            }
        )
        .is_err(),
        "no second commit"
    );
    // Going back is refused.
    assert!(apply(
        &m,
        &Event::Reached {
            key: key.clone(),
            phase: Phase::Staged
        }
    )
    .is_err());
}

#[test]
fn exhaustion_fails_the_mission_and_is_terminal() {
    let mut m = mission(2);
    for _ in 0..2 {
        let (next_m, key) = start(&m, "first");
        m = apply(
            &next_m,
            &Event::Rejected {
                key,
                reason: "no".into(),
            },
        )
        .unwrap();
    }
    assert_eq!(m.tasks[0].state, TaskState::Exhausted);
    assert_eq!(
        m.state,
        MissionState::Failed {
            task: "first".into()
        }
    );
    assert!(matches!(
        apply(
            &m,
            &Event::Start {
                task: "first".into(),
                inputs: inputs()
            }
        ),
        Err(AuthorityError::Finished(_))
    ));
    assert_eq!(
        next(&m),
        Next::Finished(MissionState::Failed {
            task: "first".into()
        })
    );
}

#[test]
fn only_one_attempt_at_a_time_and_only_on_the_current_task() {
    let (m, key) = start(&mission(3), "first");
    assert!(matches!(
        apply(
            &m,
            &Event::Start {
                task: "first".into(),
                inputs: inputs()
            }
        ),
        Err(AuthorityError::AttemptInProgress { .. })
    ));
    assert!(matches!(
        apply(
            &m,
            &Event::Start {
                task: "second".into(),
                inputs: inputs()
            }
        ),
        Err(AuthorityError::NotCurrentTask { .. })
    ));
    // Replays are no-ops.
    let r = apply(
        &m,
        &Event::Rejected {
            key: key.clone(),
            reason: "x".into(),
        },
    )
    .unwrap();
    assert_eq!(
        apply(
            &r,
            &Event::Rejected {
                key,
                reason: "x".into()
            }
        )
        .unwrap(),
        r
    );
}

fn arbitrary_event(keys: Vec<AttemptKey>) -> impl Strategy<Value = Event> {
    let key = proptest::sample::select(keys);
    prop_oneof![
        // Rare: it ends the mission, and the other events are what most sequences should try.
        1 => Just(Event::Cancel { reason: "c".into() }),
        20 => prop_oneof![Just("first"), Just("second")].prop_map(|t| Event::Start {
            task: t.into(),
            inputs: inputs()
        }),
        20 => (key.clone(), 0..5u8).prop_map(|(key, p)| Event::Reached {
            key,
            phase: [
                Phase::Claimed,
                Phase::SandboxReady,
                Phase::Staged,
                Phase::AgentStopped,
                Phase::Frozen
            ][p as usize],
        }),
        20 => (key.clone(), any::<bool>()).prop_map(|(key, with)| Event::ValidatorPassed {
            key,
            evidence: if with {
                vec!["result.txt".into()]
            } else {
                vec![]
            },
        }),
        20 => key.clone().prop_map(|key| Event::Rejected {
            key,
            reason: "r".into()
        }),
        20 => key.clone().prop_map(|key| Event::Committed {
            key,
            commit: "c".into()
        }),
        20 => key.clone().prop_map(|key| Event::Checkpointed {
            key,
            checkpoint: "cp".into()
        }),
        20 => key.clone().prop_map(|key| Event::Published {
            key,
            bundle: "bd".into()
        }),
        20 => key.prop_map(|key| Event::Finalized { key }),
    ]
}

fn all_keys() -> Vec<AttemptKey> {
    let mut keys = Vec::new();
    for task in ["first", "second"] {
        for n in 1..=3 {
            keys.push(attempt_key("m1", task, n));
        }
    }
    keys
}

fn check_invariants(m: &MissionRecord) {
    let current = m.tasks.iter().position(|t| t.state == TaskState::Open);
    for (i, task) in m.tasks.iter().enumerate() {
        assert!(
            task.attempts.len() as u32 <= task.max_attempts,
            "more attempts than allowed"
        );
        let open = task.attempts.iter().filter(|a| is_open(&a.status)).count();
        assert!(open <= 1, "two attempts in progress");
        if open == 1 {
            assert_eq!(
                Some(i),
                current,
                "only the current task has an attempt in progress"
            );
        }
        for (n, attempt) in task.attempts.iter().enumerate() {
            assert_eq!(
                attempt.key,
                attempt_key(&m.id, &task.id, n as u32 + 1),
                "keys come from (mission, task, ordinal)"
            );
        }
        if let TaskState::Done { accepted } = &task.state {
            let attempt = task
                .attempts
                .iter()
                .find(|a| &a.key == accepted)
                .expect("accepted attempt recorded");
            match &attempt.status {
                AttemptStatus::Accepted {
                    evidence,
                    commit: Some(_),
                    checkpoint: Some(_),
                    bundle: Some(_),
                    finalized: true,
                } => {
                    for required in &task.required_evidence {
                        assert!(evidence.contains(required), "accepted without its evidence");
                    }
                }
                other => panic!("task done without every gate: {other:?}"),
            }
        }
        if task.state == TaskState::Exhausted {
            assert!(
                matches!(m.state, MissionState::Failed { .. }),
                "exhaustion fails the mission"
            );
            assert!(task
                .attempts
                .iter()
                .all(|a| matches!(a.status, AttemptStatus::Rejected { .. })));
        }
    }
    if let MissionState::Cancelled { reason } = &m.state {
        assert_eq!(reason, "c", "only a cancel cancels");
    }
    if m.state == MissionState::Succeeded {
        assert!(m
            .tasks
            .iter()
            .all(|t| matches!(t.state, TaskState::Done { .. })));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever events arrive, in whatever order, the record only changes through allowed
    /// transitions and the invariants hold after every step; finished missions stay finished.
    #[test]
    fn invariants_hold_under_arbitrary_events(events in proptest::collection::vec(arbitrary_event(all_keys()), 1..80)) {
        let mut m = mission(3);
        for event in &events {
            let before = m.clone();
            match apply(&m, event) {
                Ok(after) => {
                    prop_assert!(before.state == MissionState::Running, "a finished mission changed");
                    m = after;
                }
                Err(_) => prop_assert_eq!(&m, &before),
            }
            check_invariants(&m);
        }
    }
}

#[test]
fn a_cancel_ends_a_running_mission_where_it_stands() {
    let (m, key) = start(&mission(3), "first");
    let m = to_frozen(m, &key);
    let cancelled = apply(
        &m,
        &Event::Cancel {
            reason: "wrong base".into(),
        },
    )
    .unwrap();
    assert_eq!(
        cancelled.state,
        MissionState::Cancelled {
            reason: "wrong base".into()
        }
    );
    // The attempt in progress got no verdict: it keeps its status.
    assert_eq!(cancelled.tasks, m.tasks);
    assert_eq!(next(&cancelled), Next::Finished(cancelled.state.clone()));
    // Terminal: nothing applies after it, another cancel included.
    for event in [
        Event::Cancel {
            reason: "again".into(),
        },
        Event::Rejected {
            key: key.clone(),
            reason: "late".into(),
        },
    ] {
        assert!(matches!(
            apply(&cancelled, &event),
            Err(AuthorityError::Finished(_))
        ));
    }
    // A finished mission cannot be cancelled.
    let failed = apply(
        &mission(1),
        &Event::Start {
            task: "first".into(),
            inputs: inputs(),
        },
    )
    .unwrap();
    let key = failed.open_attempt().unwrap().key.clone();
    let failed = apply(
        &failed,
        &Event::Rejected {
            key,
            reason: "no".into(),
        },
    )
    .unwrap();
    assert!(matches!(failed.state, MissionState::Failed { .. }));
    assert!(matches!(
        apply(&failed, &Event::Cancel { reason: "x".into() }),
        Err(AuthorityError::Finished(_))
    ));
}
