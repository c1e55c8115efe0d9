//! The language as backends write it: mpush 0.8.1's JavaScript conditions,
//! the server's earlier evalexpr forms, JavaScript's coercions, and what is
//! refused with a hint.

use mpush_filter::{Condition, EvalError, Fields};

const ANDROID: Fields<'static> = Fields {
    user_id: "user-7",
    tags: "test,vip",
    client_version: "2.1.0",
    os_name: "android",
    os_version: "14",
};

/// Chromium's user agent, as mpush's web page sends it (`"web " + navigator.userAgent`).
const WEB: Fields<'static> = Fields {
    user_id: "user-8",
    tags: "",
    client_version: "1.0",
    os_name: "web Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    os_version: "55.2",
};

fn eval(c: &str, f: &Fields<'_>) -> Result<bool, EvalError> {
    Condition::compile(c)
        .unwrap_or_else(|e| panic!("`{c}` compiles: {e}"))
        .eval(f)
}

fn refused(c: &str) -> String {
    match Condition::compile(c) {
        Ok(_) => panic!("`{c}` should be refused"),
        Err(e) => e.message,
    }
}

#[test]
fn mpush_conditions_from_its_sources_and_docs() {
    // mpush-test's PushClientTestMain.
    let c = "tags&&tags.indexOf('test')!=-1";
    assert_eq!(eval(c, &ANDROID), Ok(true));
    // A user bound without tags: mpush's `tags` is null, `&&` returns it,
    // and the Boolean cast fails: not selected.
    assert_eq!(eval(c, &WEB), Ok(false));
    // The issue's example of what backends send.
    let c = r#"tags.indexOf("vip") >= 0 && osName == "android""#;
    assert_eq!(eval(c, &ANDROID), Ok(true));
    assert!(eval(c, &WEB).is_err(), "null.indexOf throws, as in mpush");
    for (c, android, web) in [
        (r#"osName == "android" || osName == "ios""#, true, false),
        (r#"osName.indexOf("web") == 0"#, false, true),
        (
            r#"osName.startsWith("web ") && osName.includes("Chrome/")"#,
            false,
            true,
        ),
        (
            r#"osName.toLowerCase().indexOf("chrome") > -1"#,
            false,
            true,
        ),
        ("parseInt(osVersion) >= 10", true, true),
        ("osVersion >= 10", true, true),
        (r#"clientVersion != "1.0""#, true, false),
        (r#"clientVersion.split(".")[0] >= 2"#, true, false),
        (r#"userId.substring(0, 5) == "user-""#, true, true),
        (r#"userId.substr(-1) == "7""#, true, false),
        (r#"userId.slice(5) === "8""#, false, true),
        ("/vip|gold/.test(tags)", true, false),
        (r#"tags.split(",").indexOf("vip") >= 0"#, true, false),
        ("!!tags", true, false),
        ("!tags", false, true),
        ("tags == null", false, true),
        ("typeof tags === 'string'", true, false),
        (r#"tags.match(/v(i)p/)[1] == "i""#, true, false),
        ("osName.search(/Chrome/) > 0", false, true),
        ("userId.length == 6", true, true),
        ("(userId.charAt(5) == '7') == true", true, false),
        (r#"tags ? tags.includes("vip") : false"#, true, false),
        ("true", true, true),
    ] {
        let r = |f: &Fields<'_>| eval(c, f).unwrap_or(false);
        assert_eq!((r(&ANDROID), r(&WEB)), (android, web), "{c}");
    }
}

#[test]
fn the_earlier_evalexpr_forms_still_work() {
    // The server README's example until now.
    let c = r#"osName == "android" && str::regex_matches(tags, "vip")"#;
    assert_eq!(eval(c, &ANDROID), Ok(true));
    assert_eq!(
        eval(
            c,
            &Fields {
                tags: "beta",
                ..ANDROID
            }
        ),
        Ok(false)
    );
    assert_eq!(
        eval(
            c,
            &Fields {
                os_name: "ios",
                ..ANDROID
            }
        ),
        Ok(false)
    );
    for c in [
        r#"str::to_lowercase(osName) == "android""#,
        r#"str::to_uppercase(osName) == "ANDROID""#,
        r#"str::trim(" x ") == "x""#,
        "len(userId) == 6",
        r#"str::substring(userId, 0, 4) == "user""#,
        r#"str::from(5) == "5""#,
    ] {
        assert_eq!(eval(c, &ANDROID), Ok(true), "{c}");
    }
}

#[test]
fn javascript_coercions() {
    for c in [
        r#""1" == 1"#,
        "'' == 0",
        "null == undefined",
        "null !== undefined",
        "!(null == 0)",
        "true == 1",
        r#""10" > "9" == false"#,
        "10 > 9",
        "NaN != NaN",
        r#""b" + 1 == "b1""#,
        "1 + 2 == 3",
        "7 % 4 == 3",
        r#"String(0.1 + 0.2) == "0.30000000000000004""#,
        r#"String(1e21) == "1e+21""#,
        "Number('') === 0",
        "isNaN(Number('x'))",
        "parseFloat('1.5rc1') == 1.5",
        r#""a,b".split(",") == "a,b""#,
        "-'3' == -3",
        "+true === 1",
        "(1, 2) == 2",
    ] {
        // `(a, b)` is a sequence in JavaScript; here the comma is refused.
        if c.contains("(1, 2)") {
            assert!(Condition::compile(c).is_err());
            continue;
        }
        assert_eq!(eval(c, &ANDROID), Ok(true), "{c}");
    }
}

#[test]
fn results_that_are_not_true_booleans_do_not_select() {
    // mpush casts the result to Boolean: a string, a number or null is
    // not `true`, even when truthy.
    assert_eq!(eval("tags || false", &ANDROID), Ok(false));
    assert_eq!(eval("tags && true", &ANDROID), Ok(true));
}

#[test]
fn what_is_refused_says_what_to_write() {
    for (c, hint) in [
        ("userId", "never true or false"),
        ("osName.length", "never true or false"),
        ("foo == 1", "unknown name `foo`"),
        (
            "userId.repeat(1000) == ''",
            "never make more than their input",
        ),
        (
            "tags.padStart(99999) == ''",
            "never make more than their input",
        ),
        (
            "tags.replace('a', 'b') == ''",
            "never make more than their input",
        ),
        (
            r#"str::regex_replace(tags, "x*", tags) == """#,
            "can grow with every match",
        ),
        ("x = 1", "unknown name `x`"),
        ("userId = 'a'", "assignments are not supported"),
        ("true; true", "statements"),
        ("`a` == tags", "template literals"),
        ("new RegExp('a').test(tags)", "/literal/"),
        ("/(a)\\1/.test(tags)", "backreferences"),
        ("/(?=a)/.test(tags)", "lookaround"),
        ("tags.foo()", "unknown method `foo`"),
        ("tags.match(userId)", "regex literal"),
        ("if(true, 1, 2) == 1", "c ? a : b"),
        ("1 ^ 2 == 3", "bitwise"),
        ("userId == (", "expected a value"),
        ("(osName == 'a'", "expected `)`"),
        ("/a/ == tags", "a regex is used as"),
        ("(1).foo", "unknown property"),
        ("userId.indexOf()", "takes 1 to 2 arguments"),
        ("", "empty"),
    ] {
        let m = refused(c);
        assert!(m.contains(hint), "`{c}`: {m}");
    }
}

#[test]
fn a_legal_condition_is_never_refused_for_what_a_trial_run_would_do() {
    // A substring of userId: a trial run on empty fields would call a method
    // of null; compiling never evaluates.
    assert!(Condition::compile("userId.substring(0, 3) == 'vip'").is_ok());
    assert_eq!(eval("userId.substring(0, 3) == 'use'", &ANDROID), Ok(true));
}

#[test]
fn long_chains_of_alternatives_compile() {
    // A backend listing users: a chain is one level, not one per `||`.
    let c: Vec<String> = (0..64).map(|i| format!("userId=='u{i}'")).collect();
    let c = c.join("||");
    assert!(c.len() < 1024);
    assert_eq!(
        eval(
            &c,
            &Fields {
                user_id: "u63",
                ..ANDROID
            }
        ),
        Ok(true)
    );
    assert_eq!(
        eval(
            &c,
            &Fields {
                user_id: "u64",
                ..ANDROID
            }
        ),
        Ok(false)
    );
}

#[test]
fn limits_on_the_text_and_its_shape() {
    let deep = format!("{}true{}", "(".repeat(40), ")".repeat(40));
    assert!(refused(&deep).contains("nests deeper"));
    let nots = format!("{}true", "!".repeat(40));
    assert!(refused(&nots).contains("nests deeper"));
    let sum = vec!["1"; 100].join("+") + " == 100";
    assert!(refused(&sum).contains("nests deeper"));
    let long = format!("tags == '{}'", "x".repeat(2000));
    assert!(refused(&long).contains("at most 1024"));
    let many = (0..5)
        .map(|i| format!("/a{i}/.test(tags)"))
        .collect::<Vec<_>>()
        .join("||");
    assert!(refused(&many).contains("more than 4 regexes"));
    let big = format!("/{}/.test(tags)", "a{1000}{1000}");
    assert!(refused(&big).contains("regex"));
}
