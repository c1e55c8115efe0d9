//! Broadcast conditions (mpush-filter): any text compiles or is refused,
//! never panics; an evaluation on any fields stays within its budget,
//! measured by counting what it allocates (this binary's allocator) and by
//! the work it reports; compiling allocates in proportion to the text and
//! to the regex size limit.
//!
//! Input: the condition, then NUL, then the five fields separated by NUL
//! (userId, tags, clientVersion, osName, osVersion).
#![no_main]

use std::alloc::System;

use libfuzzer_sys::fuzz_target;
use mpush_filter::{Condition, Fields, Limits};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn allocated(r: &Region<'_, System>) -> usize {
    let c = r.change();
    c.bytes_allocated + c.bytes_reallocated.max(0) as usize
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0);
    let text = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let fields: Vec<String> = parts
        .take(5)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let field = |i: usize| fields.get(i).map_or("", String::as_str);
    let limits = Limits::DEFAULT;

    let region = Region::new(GLOBAL);
    let compiled = Condition::compile(&text);
    let compile_bytes = allocated(&region);
    // Counted cumulatively (what compiling does, not what it keeps): the
    // parse in proportion to the text, each regex's compilation in
    // proportion to the compiled size it is limited to.
    let compile_bound = (1 << 20) + 64 * text.len() + limits.max_regexes * 16 * limits.regex_size;
    assert!(
        compile_bytes <= compile_bound,
        "compiling {} bytes allocated {compile_bytes} (bound {compile_bound})",
        text.len()
    );
    let Ok(c) = compiled else { return };

    let f = Fields {
        user_id: field(0),
        tags: field(1),
        client_version: field(2),
        os_name: field(3),
        os_version: field(4),
    };
    let region = Region::new(GLOBAL);
    let (first, used) = c.eval_metered(&f);
    let eval_bytes = allocated(&region);
    // Regex search caches are made on first use and bounded by the
    // compiled size limit; everything else is the evaluation's own budget.
    let eval_bound = limits.max_bytes + c.size().1 * 4 * limits.regex_size + 4096;
    assert!(eval_bytes <= eval_bound, "evaluating allocated {eval_bytes} (bound {eval_bound}): {text:?}");
    assert!(used.bytes <= limits.max_bytes + (64 << 10), "{used:?}");
    assert!(used.work <= limits.max_work + (64 << 10), "{used:?}");
    // Evaluation is a function of the fields: the same answer again.
    assert_eq!(c.eval(&f), first);
});
