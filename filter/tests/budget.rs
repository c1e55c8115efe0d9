//! The budget holds for any condition: what an evaluation allocates (counted
//! by this test binary's allocator) and the work it reports stay within the
//! limits, for hostile conditions and for random ones over fields as long
//! as a server keeps them.

//!
//! The allocator's counters are process-wide, so everything runs in one
//! test function, on one thread.

use std::alloc::System;

use mpush_filter::{Condition, EvalError, Fields, Limits, Resource};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A regex's search caches (lazy DFA, PikeVM) are made on its first use and
/// are bounded by its compiled size limit; anything else comes out of the
/// evaluation's own budget.
fn bound(c: &Condition) -> usize {
    let l = c.limits();
    l.max_bytes + c.size().1 * 4 * l.regex_size + 4096
}

/// Evaluates and checks the budget; returns the result.
fn checked(c: &Condition, f: &Fields<'_>) -> Result<bool, EvalError> {
    let region = Region::new(GLOBAL);
    let (r, used) = c.eval_metered(f);
    let change = region.change();
    let spent = change.bytes_allocated + change.bytes_reallocated.max(0) as usize;
    let l = c.limits();
    assert!(
        spent <= bound(c),
        "allocated {spent} bytes (bound {}): {c:?}",
        bound(c)
    );
    assert!(used.bytes <= l.max_bytes + 64 * 1024, "{used:?}");
    assert!(used.work <= l.max_work + 64 * 1024, "{used:?}");
    r
}

/// Fields as long as the server keeps them (tags 4 KiB, OS name 512 bytes),
/// of characters whose case mapping grows.
fn big_fields() -> (String, String, String) {
    let tags = "ΐﬀİ,".repeat(4096 / 10);
    let os = "web ".to_owned() + &"ΐ".repeat(254);
    let user = "u".repeat(512);
    (tags, os, user)
}

#[test]
fn evaluation_stays_within_its_budget() {
    hostile_conditions();
    budget_stops();
    random_conditions();
}

fn hostile_conditions() {
    let (tags, os, user) = big_fields();
    let f = Fields {
        user_id: &user,
        tags: &tags,
        client_version: &os,
        os_name: &os,
        os_version: &tags,
    };
    // Each doubling nests once: within the depth limit it cannot reach
    // gigabytes, and the memory budget stops it far earlier.
    let mut doubling = "tags".to_owned();
    for _ in 0..6 {
        doubling = format!("({doubling}+{doubling})");
    }
    // (condition, whether its evaluation must stop on the budget)
    let hostile = [
        (format!("{doubling}.length > 0"), true),
        ("(tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags+tags).toUpperCase().toLowerCase().toUpperCase() == ''".to_owned(), true),
        ("(tags + osName + tags + osName + tags).split(',').length + (tags + tags + tags + tags).split('').length > 1".to_owned(), true),
        ("tags.toUpperCase().toUpperCase().toUpperCase().toUpperCase().toUpperCase().toUpperCase().toUpperCase() == ''".to_owned(), false),
        ("tags.split('').indexOf('x') + tags.split('').indexOf('y') + tags.split('').indexOf('z') + tags.split('').indexOf('w') > 0".to_owned(), false),
        ("tags.match(/./g).length + tags.match(/./g).length + tags.match(/./g).length + tags.match(/./g).length > 0".to_owned(), false),
        ("/(a|b|c|d|e|f|g|h|i|j)*(x|y)*z$/i.test(tags + tags + tags + tags)".to_owned(), false),
        ("String(tags.split(',')) + String(tags.split(',')) + String(tags.split(',')) == ''".to_owned(), false),
    ];
    for (c, stops) in &hostile {
        let cond = Condition::compile(c).unwrap_or_else(|e| panic!("{c}: {e}"));
        let r = checked(&cond, &f);
        assert_eq!(matches!(r, Err(EvalError::Budget(_))), *stops, "{c}: {r:?}");
    }
}

/// A stop names what was spent.
fn budget_stops() {
    let (tags, os, user) = big_fields();
    let f = Fields {
        user_id: &user,
        tags: &tags,
        client_version: "1",
        os_name: &os,
        os_version: "1",
    };
    let small = Limits {
        max_bytes: 1024,
        ..Limits::DEFAULT
    };
    let c = Condition::compile_with("tags.toUpperCase() == ''", &small).expect("compiles");
    assert_eq!(checked(&c, &f), Err(EvalError::Budget(Resource::Memory)));
    let slow = Limits {
        max_work: 1000,
        ..Limits::DEFAULT
    };
    let c = Condition::compile_with("tags.indexOf('nope') >= 0", &slow).expect("compiles");
    assert_eq!(checked(&c, &f), Err(EvalError::Budget(Resource::Work)));
}

/// Random conditions from the language's own parts.
fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("tags".to_owned()),
        Just("osName".to_owned()),
        Just("userId".to_owned()),
        Just("osVersion".to_owned()),
        Just("clientVersion".to_owned()),
        Just("'ΐx,'".to_owned()),
        Just("1".to_owned()),
        Just("-2.5".to_owned()),
        Just("null".to_owned()),
        Just("true".to_owned()),
    ];
    leaf.prop_recursive(6, 64, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} + {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} == {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} < {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} && {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} || {b})")),
            inner
                .clone()
                .prop_map(|a| format!("String({a}).toUpperCase()")),
            inner
                .clone()
                .prop_map(|a| format!("String({a}).toLowerCase()")),
            inner.clone().prop_map(|a| format!("String({a}).split('')")),
            inner
                .clone()
                .prop_map(|a| format!("String({a}).split(',')")),
            inner
                .clone()
                .prop_map(|a| format!("String({a}).match(/[a-zΐ]/g)")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("String({a}).indexOf({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("String({a}).substring({b})")),
            inner.clone().prop_map(|a| format!("String({a}).length")),
            inner.prop_map(|a| format!("!{a}")),
        ]
    })
}

fn random_conditions() {
    let mut runner = TestRunner::new(Config::with_cases(256));
    runner
        .run(
            &(expr(), 0usize..400, 0usize..120),
            |(e, tags_reps, os_reps)| {
                let tags = "ΐﬀ,v".repeat(tags_reps);
                let os = "webİ".repeat(os_reps);
                let f = Fields {
                    user_id: "user-1",
                    tags: &tags,
                    client_version: "2.0",
                    os_name: &os,
                    os_version: "14",
                };
                if let Ok(c) = Condition::compile(&format!("({e}) == true")) {
                    let _ = checked(&c, &f);
                }
                Ok(())
            },
        )
        .expect("every evaluation within its budget");
}
