//! The broadcast conditions server/README.md shows (its `js` block, tagged
//! `<!-- docs: tested-by filter/tests/readme.rs -->` for scripts/docs-test)
//! compile, and each selects the device it is written for.

use mpush_filter::{Condition, Fields};

#[test]
fn the_readme_conditions_compile_and_select() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/README.md"),
    )
    .expect("server/README.md");
    let tag = "<!-- docs: tested-by filter/tests/readme.rs -->";
    let start = readme.find(tag).expect("the tagged block") + tag.len();
    let body = &readme[start..];
    let body = &body[body.find("```js\n").expect("a js block") + 6..];
    let body = &body[..body.find("```").expect("its end")];
    let chrome = "web Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    // One device each condition is written for.
    let devices = [
        Fields {
            user_id: "u",
            tags: "a,test",
            client_version: "1.0.0",
            os_name: "android",
            os_version: "14",
        },
        Fields {
            user_id: "u",
            tags: "vip",
            client_version: "1.0.0",
            os_name: "android",
            os_version: "14",
        },
        Fields {
            user_id: "u",
            tags: "",
            client_version: "1.0.0",
            os_name: chrome,
            os_version: "",
        },
        Fields {
            user_id: "u",
            tags: "",
            client_version: "2.1.0",
            os_name: "android",
            os_version: "14",
        },
        Fields {
            user_id: "gold-7",
            tags: "",
            client_version: "1.0.0",
            os_name: "ios",
            os_version: "17",
        },
    ];
    let lines: Vec<&str> = body
        .lines()
        .map(|l| l.split("  //").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), devices.len(), "{lines:?}");
    for (src, d) in lines.iter().zip(&devices) {
        let c = Condition::compile(src).unwrap_or_else(|e| panic!("{src}: {e:?}"));
        assert_eq!(c.eval(d), Ok(true), "{src}");
    }
}
