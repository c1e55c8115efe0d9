//! The figures against the targets, `BENCHMARKS.md` and its SVG charts.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde_json::Value;

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// One target of the issue: what was measured, against what.
pub struct Target {
    pub name: String,
    pub measured: f64,
    pub target: f64,
    /// True when more is better.
    pub at_least: bool,
    pub unit: &'static str,
    /// Why this run has no figure for it (the tool does not measure it yet).
    pub missing: Option<&'static str>,
}

impl Target {
    fn new(
        name: impl Into<String>,
        measured: f64,
        cmp: &str,
        target: f64,
        unit: &'static str,
    ) -> Self {
        Self {
            name: name.into(),
            measured,
            target,
            at_least: cmp == ">=",
            unit,
            missing: None,
        }
    }

    /// A target this run has no figure for, and why.
    fn missing(name: &str, cmp: &str, target: f64, unit: &'static str, why: &'static str) -> Self {
        Self {
            missing: Some(why),
            ..Self::new(name, f64::NAN, cmp, target, unit)
        }
    }

    /// The measured figure as the report prints it.
    pub fn shown(&self) -> String {
        if self.missing.is_some() {
            "–".into()
        } else {
            format!("{:.2} {}", self.measured, self.unit)
        }
    }

    pub fn met(&self) -> bool {
        if self.at_least {
            self.measured >= self.target
        } else {
            self.measured <= self.target
        }
    }

    /// "met", or how far off as a factor.
    pub fn verdict(&self) -> String {
        if let Some(why) = self.missing {
            format!("not measured: {why}")
        } else if self.met() {
            "met".into()
        } else if self.at_least && self.measured > 0.0 {
            format!("missed: {:.2}x short", self.target / self.measured)
        } else if self.target > 0.0 {
            format!("missed: {:.2}x over", self.measured / self.target)
        } else {
            "missed".into()
        }
    }
}

pub fn targets(r: &Value) -> Vec<Target> {
    let mut t = Vec::new();
    for c in r["connections"].as_array().into_iter().flatten() {
        let ws = c["transport"] == "Ws";
        t.push(Target {
            name: format!(
                "memory per idle bound connection, {} {}",
                if ws { "WebSocket" } else { "TCP" },
                c["profile"].as_str().unwrap_or("?")
            ),
            measured: f(&c["bytes_per_conn"]),
            // v2 (the profile new clients speak): issue 27's floors;
            // legacy keeps the earlier ones.
            target: match (ws, c["profile"] == "v2") {
                (false, true) => 2048.0,
                (true, true) => 3584.0,
                (false, false) => 3584.0,
                (true, false) => 5120.0,
            },
            at_least: false,
            unit: "B",
            missing: None,
        });
    }
    if let Some(c) = r["connections"].as_array().and_then(|a| a.first()) {
        t.push(Target {
            name: "full handshakes per second (TCP v2)".into(),
            measured: f(&c["handshakes_per_s"]),
            target: 3000.0,
            at_least: true,
            unit: "/s",
            missing: None,
        });
    }
    let cpu = &r["cpu"];
    if !cpu.is_null() {
        t.push(Target {
            name: "fast connects per core-second of server CPU (TCP v2; the clients' own kernel time not counted)".into(),
            measured: f(&cpu["fast_connects_per_core_s"]),
            target: 15_000.0,
            at_least: true,
            unit: "/s",
            missing: None,
        });
        t.push(Target {
            name: "server CPU per broadcast delivery, back to back (one core, 10k connections)"
                .into(),
            measured: f(&cpu["broadcast_back_to_back"]["cpu_us_per_delivery"]),
            target: 3.0,
            at_least: false,
            unit: "us",
            missing: None,
        });
        t.push(Target {
            name: "server CPU per broadcast delivery, one at a time, the server alone".into(),
            measured: f(&cpu["broadcast_one_at_a_time"]["cpu_us_per_delivery"]),
            target: 6.0,
            at_least: false,
            unit: "us",
            missing: None,
        });
        if !cpu["broadcast_condition_js"].is_null() {
            let b2b = f(&cpu["broadcast_back_to_back"]["cpu_us_per_delivery"]);
            let one = &cpu["broadcast_condition_one_at_a_time"]["cpu_us_per_delivery"];
            const NAME: &str = "server CPU per broadcast delivery with a condition (mpush's JavaScript form), vs without";
            let (name, measured) = if one.is_null() {
                // Reports written before the phases alternated.
                (
                    NAME.to_string(),
                    f(&cpu["broadcast_condition_js"]["cpu_us_per_delivery"]) / b2b.max(1e-9),
                )
            } else {
                let added = f(&one["condition_js"]) - f(&one["none"]);
                (
                    format!(
                        "{NAME}: what evaluating it adds ({added:.2} us, one broadcast at a time, alternating with none) over a delivery back to back ({b2b:.2} us)"
                    ),
                    (b2b + added) / b2b.max(1e-9),
                )
            };
            t.push(Target {
                name,
                measured,
                target: 1.5,
                at_least: false,
                unit: "x",
                missing: None,
            });
        }
        // One at a time on the limited server itself, before and after the
        // limited broadcasts (runs before it have only the other server's).
        let limited = &cpu["broadcast_rate_limited"];
        let (free, free_name) =
            match limited["one_at_a_time_same_process"]["cpu_us_per_delivery"].as_f64() {
                Some(v) => (
                    v,
                    "one at a time unlimited on the same server, before and after it",
                ),
                None => (
                    f(&cpu["broadcast_one_at_a_time"]["cpu_us_per_delivery"]),
                    "one at a time unlimited",
                ),
            };
        t.push(Target {
            name: format!(
                "server CPU per delivery under the shipped rate limit ({:.2} us), vs {free_name} ({free:.2} us)",
                f(&limited["cpu_us_per_delivery"]),
            ),
            measured: f(&limited["cpu_us_per_delivery"]) / free.max(1e-9),
            target: 1.1,
            at_least: false,
            unit: "x",
            missing: None,
        });
        t.push(Target {
            name: format!(
                "RSS after {} broadcast deliveries, vs idle",
                cpu["rss_after"]["deliveries"]
            ),
            measured: f(&cpu["rss_after"]["x_idle"]),
            target: 1.5,
            at_least: false,
            unit: "x",
            missing: None,
        });
    }
    let d = &r["delivery"];
    t.push(Target {
        name: "unicast through the batch API".into(),
        measured: f(&d["batch"]["per_s"]),
        target: 300_000.0,
        at_least: true,
        unit: "msg/s",
        missing: None,
    });
    t.push(Target {
        name: format!(
            "p99 latency at {}/s (API call to client receipt)",
            d["paced"]["rate"]
        ),
        measured: f(&d["paced"]["latency"]["p99_us"]) / 1000.0,
        target: 5.0,
        at_least: false,
        unit: "ms",
        missing: None,
    });
    // Broadcast at 10k connections on one process (the largest one-process point).
    if let Some(b) = r["broadcast_scale"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["nodes"] == 1)
        .max_by_key(|b| b["conns"].as_u64().unwrap_or(0))
    {
        t.push(Target {
            name: format!("broadcast fan-out vs the ideal, {} connections", b["conns"]),
            measured: f(&b["per_s"]) / f(&b["ideal_per_s"]).max(1.0),
            target: 0.5,
            at_least: true,
            unit: "x ideal",
            missing: None,
        });
    }
    // Every message's trace keeps its states under the flood: a trace writer
    // that falls behind drops events (counted), which would also make the
    // rates above cheaper than they are.
    let dropped = &d["batch"]["trace_events_dropped"];
    t.push(Target {
        name: "trace events dropped while the batch and cluster phases flood the servers".into(),
        measured: f(dropped) + f(&r["cluster"]["trace_events_dropped"]),
        target: 0.0,
        at_least: false,
        unit: "events",
        missing: dropped
            .is_null()
            .then_some("this run's server did not report it"),
    });
    let c = &r["cluster"];
    if !c.is_null() {
        t.push(Target {
            name: "cross-node unicast, 3 nodes on one Redis".into(),
            measured: f(&c["per_s"]),
            target: 80_000.0,
            at_least: true,
            unit: "msg/s",
            missing: None,
        });
    }
    t.extend(round3(r));
    t
}

/// Issue 27's floors: ratios to a reference measured in the same run.
fn round3(r: &Value) -> Vec<Target> {
    let mut t = Vec::new();
    let cpu = &r["cpu"];
    if !cpu.is_null() {
        let accept = f(&cpu["ideal_accept_cpu_us"]);
        let rsa = f(&cpu["ideal_rsa_op_cpu_us"]);
        let backend = match cpu["ideal_rsa_backend"].as_str() {
            Some("openssl") => ", OpenSSL",
            Some("rsa") => ", the rsa crate",
            _ => "",
        };
        t.push(Target::new(
            format!(
                "server CPU per full RSA connect (connect, handshake, bind: {:.0} us), vs the ideal's plain accept ({accept:.0} us) plus one RSA private-key operation ({rsa:.0} us{backend})",
                f(&cpu["handshake_cpu_us"])
            ),
            f(&cpu["handshake_cpu_us"]) / (accept + rsa).max(1e-9),
            "<=",
            1.5,
            "x",
        ));
        // Alternating with the ideal's accepts in parts when the run did
        // (results before it measured the accepts minutes later).
        let how = match cpu["fast_connect_alternating"]["parts"].as_u64() {
            Some(1) => "measured right after".to_owned(),
            Some(p) => format!("alternating in {p} parts"),
            None => "measured a few minutes later".to_owned(),
        };
        t.push(Target::new(
            format!(
                "server CPU per fast connect and bind, TCP v2 ({:.0} us; the old connection's close, measured apart: {:.0} us), vs the ideal's plain accept ({accept:.0} us, {how})",
                f(&cpu["fast_connect_cpu_us"]),
                f(&cpu["close_cpu_us"])
            ),
            f(&cpu["fast_connect_cpu_us"]) / accept.max(1e-9),
            "<=",
            2.0,
            "x",
        ));
        // Alternating with the ideal in the same minutes when the run has
        // it (results before it measured the two a few minutes apart).
        let alt = &cpu["one_at_a_time_alternating"];
        let (ours, ideal, how) = if alt.is_null() {
            (
                f(&cpu["broadcast_one_at_a_time"]["cpu_us_per_delivery"]),
                f(&cpu["ideal_one_at_a_time_cpu_us_per_delivery"]),
                "measured one after the other",
            )
        } else {
            (
                f(&alt["cpu_us_per_delivery"]),
                f(&alt["ideal_cpu_us_per_delivery"]),
                "measured alternately",
            )
        };
        t.push(Target::new(
            format!(
                "server CPU per broadcast delivery, one broadcast at a time, vs the ideal, {how} ({ours:.2} us vs {ideal:.2} us)"
            ),
            ours / ideal.max(1e-9),
            "<=",
            1.3,
            "x",
        ));
        let lat = &cpu["single_paced"]["latency"];
        if !lat.is_null() {
            let (p50, p99) = (f(&lat["p50_us"]) / 1000.0, f(&lat["p99_us"]) / 1000.0);
            // The ideal's tail on the same terms (measured after the fast
            // connects), when the run has it: what this machine allows.
            let il = &cpu["single_paced"]["ideal_latency"];
            let ideal = if il.is_null() {
                String::new()
            } else {
                let (i50, i99) = (f(&il["p50_us"]) / 1000.0, f(&il["p99_us"]) / 1000.0);
                format!(
                    " (the ideal server's, same terms: p99 {i99:.3} ms, {:.2}x its p50 of {i50:.3} ms)",
                    i99 / i50.max(1e-9)
                )
            };
            t.push(Target::new(
                format!(
                    "p99 API call to client receipt, single-user pushes at 1,000/s, {} idle connections, server on one core{ideal}",
                    cpu["conns"]
                ),
                p99,
                "<=",
                0.5,
                "ms",
            ));
            t.push(Target::new(
                format!("the same p99 vs the same run's p50 ({p50:.3} ms)"),
                p99 / p50.max(1e-9),
                "<=",
                2.5,
                "x",
            ));
        }
    }
    let tls = &cpu["tls"];
    if tls.is_null() {
        t.push(Target::missing(
            "server CPU per connect over TLS with the transport-secured profile, vs the ideal's TLS accept",
            "<=",
            1.5,
            "x",
            "this run has no TLS figures",
        ));
    } else {
        for (key, what) in [("tcp", "TCP"), ("ws", "WebSocket")] {
            let ideal = f(tls_ideal(tls, key));
            let alternating = match tls["parts"].as_u64() {
                Some(p) if p > 1 => format!(", alternating in {p} parts"),
                _ => String::new(),
            };
            t.push(Target::new(
                format!(
                    "server CPU per connect over TLS with the transport-secured profile, {what} ({:.0} us: TLS, handshake, bind), vs the ideal's TLS accept alone ({ideal:.0} us{alternating})",
                    f(&tls[key]["connect_cpu_us"])
                ),
                f(&tls[key]["connect_cpu_us"]) / ideal.max(1e-9),
                "<=",
                1.5,
                "x",
            ));
        }
    }
    let st = &r["storm"];
    if st.is_null() {
        t.push(Target::missing(
            "reconnect storm: node killed and restarted; seconds until every client is bound again",
            "<=",
            10.0,
            "s",
            "this run has no storm figures",
        ));
    } else {
        for (key, what) in [
            ("kill_redis", "on Redis (sessions kept: fast connects)"),
            (
                "kill_embedded",
                "with the embedded store (sessions lost: RSA handshakes)",
            ),
        ] {
            t.push(Target::new(
                format!(
                    "reconnect storm: {} clients, node {what} killed and restarted; seconds until every one is bound again (none gives up)",
                    st["conns"]
                ),
                f(&st[key]["seconds_to_all_bound"]),
                "<=",
                10.0,
                "s",
            ));
        }
    }
    let d = &r["delivery"];
    let ideal_unicast = f(&r["ideal"]["delivery"]["unicast"]["per_s"]);
    if !d.is_null() && ideal_unicast > 0.0 {
        t.push(Target::new(
            "unicast through the batch API, vs the ideal's unicast",
            f(&d["batch"]["per_s"]) / ideal_unicast,
            ">=",
            0.9,
            "x",
        ));
    }
    if !r["cluster"].is_null() && !d.is_null() {
        t.push(Target::new(
            "cross-node unicast on 3 nodes and one Redis, vs single-node batch unicast",
            f(&r["cluster"]["per_s"]) / f(&d["batch"]["per_s"]).max(1e-9),
            ">=",
            0.6,
            "x",
        ));
    }
    let steps: Vec<&Value> = r["curve"].as_array().into_iter().flatten().collect();
    match (steps.first(), steps.last()) {
        (Some(a), Some(b)) if steps.len() > 1 => t.push(Target::new(
            format!(
                "RSS per connection at {} connections vs at {} ({} node processes on one Redis; {:.0} B vs {:.0} B)",
                b["conns"],
                a["conns"],
                b["nodes"],
                f(&b["rss_bytes_per_conn_mean"]),
                f(&a["rss_bytes_per_conn_mean"])
            ),
            f(&b["rss_bytes_per_conn_mean"]) / f(&a["rss_bytes_per_conn_mean"]).max(1e-9),
            "<=",
            1.1,
            "x",
        )),
        _ => t.push(Target::missing(
            "RSS per connection at 100k connections vs at 10k",
            "<=",
            1.1,
            "x",
            "this run has no cost curve",
        )),
    }
    t
}

// ----- SVG charts (hand-drawn: lines, log axes, a legend) -------------------

pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A line chart; both axes logarithmic (base 10) when `log` is set for them.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
    log_y: bool,
    x_ticks: &[(f64, &str)],
) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 420.0, 80.0, 180.0, 40.0, 60.0);
    let tx = |v: f64| if log_x { v.max(1e-9).log10() } else { v };
    let ty = |v: f64| if log_y { v.max(1e-9).log10() } else { v };
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    let (mut y0, mut y1) = (f64::MAX, f64::MIN);
    for &(x, y) in pts() {
        x0 = x0.min(tx(x));
        x1 = x1.max(tx(x));
        y0 = y0.min(ty(y));
        y1 = y1.max(ty(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let mut lin_step = 1.0;
    if log_y {
        y0 = y0.floor();
        y1 = y1.ceil().max(y0 + 1.0);
    } else {
        // A round step (1, 2 or 5 times a power of ten), about five ticks.
        y0 = 0.0;
        let top = if y1 > 0.0 { y1 * 1.05 } else { 1.0 };
        let raw = top / 5.0;
        let p = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * p)
            .find(|st| *st >= raw)
            .unwrap_or(10.0 * p);
        y1 = (top / step).ceil() * step;
        lin_step = step;
    }
    if (x1 - x0).abs() < 1e-9 {
        x1 = x0 + 1.0;
    }
    let px = |x: f64| left + (tx(x) - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| h - bottom - (ty(y) - y0) / (y1 - y0) * (h - top - bottom);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        left,
        esc(title)
    );
    // Axes, grid and ticks.
    let (ax0, ax1, ay0, ay1) = (left, w - right, h - bottom, top);
    let _ = writeln!(
        o,
        r##"<path d="M{ax0},{ay1} L{ax0},{ay0} L{ax1},{ay0}" stroke="#333" fill="none"/>"##
    );
    let y_ticks: Vec<f64> = if log_y {
        (y0 as i32..=y1 as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        let n = (y1 / lin_step).round() as i32;
        (0..=n.clamp(1, 20)).map(|k| lin_step * k as f64).collect()
    };
    for v in y_ticks {
        let y = py(v);
        let label = if v >= 1_000_000.0 {
            format!("{:.1}M", v / 1_000_000.0)
        } else if v >= 1000.0 {
            format!("{:.0}k", v / 1000.0)
        } else if v.fract().abs() > 1e-9 {
            format!("{v:.1}")
        } else {
            format!("{v:.0}")
        };
        let _ = writeln!(
            o,
            r##"<line x1="{ax0}" y1="{y:.1}" x2="{ax1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{label}</text>"##,
            ax0 - 6.0,
            y + 4.0
        );
    }
    for &(v, label) in x_ticks {
        let x = px(v);
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{ay0}" x2="{x:.1}" y2="{}" stroke="#333"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            ay0 + 5.0,
            ay0 + 20.0,
            esc(label)
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (ax0 + ax1) / 2.0,
        h - 15.0,
        esc(x_label)
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (ay0 + ay1) / 2.0,
        esc(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let d: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        if !d.is_empty() {
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
                d.join(" "),
                s.color
            );
            for p in &d {
                let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(o, r#"<circle cx="{x}" cy="{y}" r="3" fill="{}"/>"#, s.color);
            }
        }
        let ly = top + 20.0 + i as f64 * 20.0;
        let lx = w - right + 15.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            s.color,
            lx + 26.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// "Nines" for a quantile: 0.9 → 1, 0.99 → 2, 0.999 → 3.
fn nines(q: f64) -> f64 {
    -(1.0 - q).max(1e-6).log10()
}

fn latency_series(name: &str, color: &'static str, v: &Value) -> Series {
    Series {
        name: name.into(),
        color,
        points: v["quantiles"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| Some((nines(p[0].as_f64()?), p[1].as_f64()?.max(1.0))))
            .collect(),
    }
}

pub fn latency_chart(r: &Value) -> String {
    let d = &r["delivery"];
    let series = vec![
        latency_series("batch API, flat out", "#d62728", &d["batch"]["latency"]),
        latency_series(
            &format!("batch API, {}/s", d["paced"]["rate"]),
            "#1f77b4",
            &d["paced"]["latency"],
        ),
        latency_series("single API", "#2ca02c", &d["single"]["latency"]),
        latency_series("broadcast", "#9467bd", &d["broadcast"]["latency"]),
        latency_series(
            "ideal, unicast",
            "#7f7f7f",
            &r["ideal"]["delivery"]["unicast"]["latency"],
        ),
    ];
    line_chart(
        "Latency, API call to client receipt",
        "percentile",
        "microseconds (log)",
        &series,
        false,
        true,
        &[
            (nines(0.5), "p50"),
            (nines(0.9), "p90"),
            (nines(0.99), "p99"),
            (nines(0.999), "p99.9"),
            (nines(0.9999), "p99.99"),
        ],
    )
}

pub fn broadcast_chart(r: &Value) -> String {
    let pts = |key: &str| -> Vec<(f64, f64)> {
        r["broadcast_scale"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| (f(&b["conns"]), f(&b[key])))
            .collect()
    };
    let ticks: Vec<(f64, String)> = r["broadcast_scale"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            let n = f(&b["conns"]);
            let label = if n >= 1000.0 {
                format!("{}k", n / 1000.0)
            } else {
                format!("{n}")
            };
            (n, format!("{label} ({}p)", b["nodes"]))
        })
        .collect();
    let tick_refs: Vec<(f64, &str)> = ticks.iter().map(|(v, l)| (*v, l.as_str())).collect();
    line_chart(
        "Broadcast fan-out, 64-byte messages, encryption on",
        "connections (server processes)",
        "messages delivered per second",
        &[
            Series {
                name: "mpush-server".into(),
                color: "#d62728",
                points: pts("per_s"),
            },
            Series {
                name: "ideal server".into(),
                color: "#7f7f7f",
                points: pts("ideal_per_s"),
            },
        ],
        true,
        false,
        &tick_refs,
    )
}

/// The cost curve: each per-connection or per-delivery cost as a multiple
/// of its value at the first step (flat at 1 is the shape to reach).
pub fn curve_chart(r: &Value) -> String {
    let steps: Vec<&Value> = r["curve"].as_array().into_iter().flatten().collect();
    let first = steps.first().copied().cloned().unwrap_or(Value::Null);
    let rel = |get: &dyn Fn(&Value) -> f64| -> Vec<(f64, f64)> {
        let base = get(&first).max(1e-9);
        steps
            .iter()
            .map(|st| (f(&st["conns"]), get(st) / base))
            .collect()
    };
    let ticks: Vec<(f64, String)> = steps
        .iter()
        .map(|st| {
            let n = f(&st["conns"]);
            (n, format!("{}k ({}p)", n / 1000.0, st["nodes"]))
        })
        .collect();
    let tick_refs: Vec<(f64, &str)> = ticks.iter().map(|(v, l)| (*v, l.as_str())).collect();
    line_chart(
        "Cost curve: cost per connection and per delivery, vs the first step",
        "connections (node processes, one Redis)",
        "x the first step's cost",
        &[
            Series {
                name: "RSS per connection".into(),
                color: "#d62728",
                points: rel(&|v| f(&v["rss_bytes_per_conn_mean"])),
            },
            Series {
                name: "Redis memory per connection".into(),
                color: "#1f77b4",
                points: rel(&|v| f(&v["redis_bytes_per_conn"])),
            },
            Series {
                name: "server CPU per broadcast delivery".into(),
                color: "#2ca02c",
                points: rel(&|v| f(&v["broadcast_cpu_us_per_delivery"])),
            },
            Series {
                name: "unicast p99 at 1,000/s".into(),
                color: "#9467bd",
                points: rel(&|v| f(&v["unicast_1000_per_s"]["p99_us"])),
            },
        ],
        true,
        false,
        &tick_refs,
    )
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpu}, {cores} cores, {:.0} GiB, Linux {}; loopback only; the load clients share the machine",
        mem_kb as f64 / 1024.0 / 1024.0,
        kernel.trim()
    )
}

/// A latency's quantiles, "p50 0.123 ms, p99 …".
fn quantiles_ms(lat: &Value) -> String {
    lat["quantiles"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| format!("p{} {:.3} ms", f(&q[0]) * 100.0, f(&q[1]) / 1000.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn lat(v: &Value) -> String {
    if v.is_null() {
        return "–".into();
    }
    format!(
        "{:.2} / {:.2} / {:.2} ms",
        f(&v["p50_us"]) / 1000.0,
        f(&v["p99_us"]) / 1000.0,
        f(&v["p999_us"]) / 1000.0
    )
}

/// Writes `BENCHMARKS.md` (and its charts beside it in `docs/bench/`).
pub fn write(r: &Value, md: &Path, command: &str) -> Result<()> {
    let dir = md
        .parent()
        .unwrap_or(Path::new("."))
        .join("docs")
        .join("bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("latency.svg"), latency_chart(r))?;
    std::fs::write(dir.join("broadcast.svg"), broadcast_chart(r))?;
    if !r["curve"].is_null() {
        std::fs::write(dir.join("curve.svg"), curve_chart(r))?;
    }
    let ideal = &r["ideal"];
    let mut o = String::new();
    let _ = writeln!(o, "# Benchmarks\n");
    let _ = writeln!(
        o,
        "Generated by `mpush-bench` (`bench/`): the release `mpush-server` and a minimal ideal tokio \
         server (no protocol; one task and one queue per connection; queued messages coalesced into \
         one write) measured in the same run, so every figure also stands as a ratio to what this \
         machine can do at best. Clients are real protocol clients (RSA handshake or fast connect, \
         bind, ACKs, dedup) in worker processes of at most 19,000 sockets each, from 127.0.0.2 and up.\n"
    );
    let _ = writeln!(
        o,
        "Regenerate (about {m:.0} minutes; the scale, cluster, curve and storm scenarios start their \
         own `redis-server`, so it must be installed: `apt-get install redis-server`):\n\n<!-- docs: skip a full run takes the machine for about {m:.0} minutes; the test command runs `mpush-bench run --quick` -->\n```sh\n{command}\n```\n",
        m = (f(&r["seconds"]) / 60.0).ceil()
    );
    let _ = writeln!(o, "Machine: {}.\n", machine());
    let _ = writeln!(
        o,
        "## Targets\n\n| target | measured | goal | verdict |\n|---|---|---|---|"
    );
    for t in targets(r) {
        let _ = writeln!(
            o,
            "| {} | {} | {} {} {} | {} |",
            t.name,
            t.shown(),
            if t.at_least { "≥" } else { "≤" },
            t.target,
            t.unit,
            t.verdict()
        );
    }
    let ib = f(&ideal["bytes_per_conn"]);
    let _ = writeln!(
        o,
        "\n## Connections ({} per row)\n\nThe ideal server holds an idle connection in {:.0} B of userland memory (RSS delta / N).\n",
        r["conns"], ib
    );
    let _ = writeln!(
        o,
        "| transport / profile | B per idle bound connection | × ideal | full handshakes/s | fast connects/s |\n|---|---|---|---|---|"
    );
    for c in r["connections"].as_array().into_iter().flatten() {
        let b = f(&c["bytes_per_conn"]);
        let _ = writeln!(
            o,
            "| {} {} | {:.0} | {:.2} | {:.0} | {:.0} |",
            if c["transport"] == "Ws" {
                "WebSocket"
            } else {
                "TCP"
            },
            c["profile"].as_str().unwrap_or("?"),
            b,
            b / ib.max(1.0),
            f(&c["handshakes_per_s"]),
            f(&c["fast_connects_per_s"])
        );
    }
    let d = &r["delivery"];
    let iu = f(&ideal["delivery"]["unicast"]["per_s"]);
    let _ = writeln!(
        o,
        "\n## Unicast ({} connections, TCP, v2, 64-byte messages)\n\nLatency is from the API call to the client's receipt (p50 / p99 / p99.9).\n\n| path | messages/s | × ideal | latency |\n|---|---|---|---|",
        d["conns"]
    );
    let _ = writeln!(
        o,
        "| batch API (1,000 users per request, 8 callers) | {:.0} | {:.2} | {} |",
        f(&d["batch"]["per_s"]),
        f(&d["batch"]["per_s"]) / iu.max(1.0),
        lat(&d["batch"]["latency"])
    );
    let _ = writeln!(
        o,
        "| single-user API (64 callers) | {:.0} | {:.2} | {} |",
        f(&d["single"]["per_s"]),
        f(&d["single"]["per_s"]) / iu.max(1.0),
        lat(&d["single"]["latency"])
    );
    let _ = writeln!(
        o,
        "| batch API paced at {}/s for {} s | – | – | {} |",
        d["paced"]["rate"],
        d["paced"]["seconds"],
        lat(&d["paced"]["latency"])
    );
    let _ = writeln!(
        o,
        "| ideal server, round-robin | {:.0} | 1 | {} |",
        iu,
        lat(&ideal["delivery"]["unicast"]["latency"])
    );
    let c = &r["cluster"];
    let _ = writeln!(
        o,
        "| cluster: 3 nodes on one Redis, API on A, clients on B and C | {:.0} | {:.2} | {} |",
        f(&c["per_s"]),
        f(&c["per_s"]) / iu.max(1.0),
        lat(&c["latency"])
    );
    if let Some(cpu) = d["batch"]["cpu_us_per_message"].as_f64() {
        let _ = writeln!(
            o,
            "\nThrough the batch API the server spent {cpu:.2} µs of CPU per message (its \
             process's CPU clock over the phase, the clients' work not included; the rate \
             moves with how the two cores are shared, this figure much less)."
        );
    }
    if let Some(n) = d["batch"]["trace_events_dropped"].as_f64() {
        let cluster = c["trace_events_dropped"].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            o,
            "\nTrace events the server dropped (`mpush_trace_events_dropped_total`: its trace \
             writer fell behind) in the batch phase: {n:.0}; on the three nodes of the cluster \
             phase: {cluster:.0}. Every message's trace has its states only when both are 0."
        );
    }
    if let Some(b) = c["redis_trace_bytes_per_message"].as_f64() {
        let _ = writeln!(
            o,
            "
In the cluster, each message's trace took {b:.0} B of Redis memory (`used_memory` \
             before and after the phase, over its messages; traces of 1,000 recipients each). \
             Redis keeps a trace for `delivery.trace_ttl_secs` (7 days by default): size Redis for \
             messages per second × that TTL × this figure, shorten the TTL, or bound the traces' bytes \
             with `delivery.redis_trace_max_bytes` (the server README's *Sizing Redis*)."
        );
    }
    let up = &r["upstream"];
    if let Some(rows) = up.as_array() {
        let _ = writeln!(
            o,
            "\n## Up-push: clients to the backend ({} connections, TCP v2, 64-byte messages, {} un-ACKed each)\n\n\
             Each connection pushes up as fast as the server accepts. The client's ACK means accepted: \
             a synchronous webhook's receiver answered 2xx (batched POSTs, 8 in flight), an asynchronous \
             one's bounded queue took it, the stream's `XADD` returned. *Accepted/s* counts from the \
             first handshake to the last ACK; *at the backend/s* until the receiver (or `XLEN`) had \
             every one. Latency is push → ACK at the client.\n\n\
             | sink | accepted/s | at the backend/s | push → ACK p50 / p99 / p99.9 |\n|---|---|---|---|",
            rows.first().map_or(Value::Null, |v| v["conns"].clone()),
            16
        );
        for u in rows {
            let _ = writeln!(
                o,
                "| {} | {:.0} | {:.0} | {:.2} / {:.2} / {:.2} ms |",
                u["sink"].as_str().unwrap_or(""),
                f(&u["accepted_per_s"]),
                f(&u["delivered_per_s"]),
                f(&u["p50_us"]) / 1000.0,
                f(&u["p99_us"]) / 1000.0,
                f(&u["p999_us"]) / 1000.0,
            );
        }
    }
    let _ = writeln!(
        o,
        "\n## Broadcast fan-out (64-byte messages, encryption on)\n\nBeyond one process's 19,990 sockets the server runs as a cluster on Redis (the broadcast crosses nodes) and the ideal as as many processes.\n\n| connections | server processes | messages/s | ideal messages/s | × ideal | latency |\n|---|---|---|---|---|---|"
    );
    for b in r["broadcast_scale"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} |",
            b["conns"],
            b["nodes"],
            f(&b["per_s"]),
            f(&b["ideal_per_s"]),
            f(&b["per_s"]) / f(&b["ideal_per_s"]).max(1.0),
            lat(&b["latency"])
        );
    }
    let cpu = &r["cpu"];
    if !cpu.is_null() {
        let _ = writeln!(
            o,
            "\n## Server CPU and memory, the server on one core ({} connections, TCP v2)\n\n\
             The server is pinned to CPU 0 and the load workers to the others; CPU is the server \
             process's CPU clock (user and system time, to the nanosecond), so the clients' own user \
             and kernel time is not in it (on loopback the sender's syscall still carries the \
             receiving socket's kernel work). The ideal server is measured the same way. In a full \
             run the scenario first waits (at most 75 s) for the earlier scenarios' closed \
             connections to leave TIME_WAIT. {}\n\n| work | server CPU | ideal server |\n|---|---|---|",
            cpu["conns"],
            match cpu["fast_connect_alternating"]["parts"].as_u64() {
                Some(1) =>
                    "The ideal's accepts are measured right after the fast connects.".to_owned(),
                Some(p) => format!(
                    "The clients come back with their tickets in {p} parts, each beside as many \
                     of the ideal's accepts (the side that goes first alternates), so the fast \
                     connect and the accept it is compared with are measured in the same minute."
                ),
                None => "The ideal's accepts were measured after the server's phases.".to_owned(),
            }
        );
        let us = |v: &Value| format!("{:.2} µs", f(v));
        let _ = writeln!(
            o,
            "| full connect: accept, RSA handshake, bind | {} | {} (accept) + {} (one RSA private-key operation) |",
            us(&cpu["handshake_cpu_us"]),
            us(&cpu["ideal_accept_cpu_us"]),
            us(&cpu["ideal_rsa_op_cpu_us"])
        );
        let _ = writeln!(
            o,
            "| fast connect + bind | {} ({:.0} per core-second) | {} (accept) |",
            us(&cpu["fast_connect_cpu_us"]),
            f(&cpu["fast_connects_per_core_s"]),
            us(&cpu["ideal_accept_cpu_us"])
        );
        if !cpu["close_cpu_us"].is_null() {
            let _ = writeln!(
                o,
                "| the close of a bound connection by its client (before it fast-connects) | {} | – |",
                us(&cpu["close_cpu_us"])
            );
        }
        if !cpu["idle_cpu_ms_per_s"].is_null() {
            let _ = writeln!(
                o,
                "| every connection bound and idle (timers, the metrics sampler) | {:.2} ms per second | – |",
                f(&cpu["idle_cpu_ms_per_s"])
            );
        }
        let tls = &cpu["tls"];
        if !tls.is_null() {
            for (key, what) in [("tcp", "TCP"), ("ws", "WebSocket")] {
                let _ = writeln!(
                    o,
                    "| {what} over TLS, transport-secured profile: connect + bind | {} | {} (TLS accept) |",
                    us(&tls[key]["connect_cpu_us"]),
                    us(tls_ideal(tls, key))
                );
                let _ = writeln!(
                    o,
                    "| {what} over TLS: reconnect with the TLS session ticket and the resume ticket ({} of {} TLS sessions resumed) | {} | – |",
                    f(&tls[key]["tls_resumed"]) as u64,
                    tls["conns"],
                    us(&tls[key]["fast_connect_cpu_us"])
                );
            }
        }
        let sp = &cpu["single_paced"];
        if !sp.is_null() {
            let _ = writeln!(
                o,
                "| single-user push through the API at {}/s (HTTP, route, seal, write) | {} | – |",
                sp["rate"],
                us(&sp["cpu_us_per_push"])
            );
        }
        let _ = writeln!(
            o,
            "| broadcast delivery, {} broadcasts back to back | {} | {} |",
            cpu["broadcast_back_to_back"]["broadcasts"],
            us(&cpu["broadcast_back_to_back"]["cpu_us_per_delivery"]),
            us(&cpu["ideal_back_to_back_cpu_us_per_delivery"])
        );
        let alt = &cpu["one_at_a_time_alternating"];
        if alt.is_null() {
            let _ = writeln!(
                o,
                "| broadcast delivery, one broadcast in flight at a time ({}) | {} | {} |",
                cpu["broadcast_one_at_a_time"]["broadcasts"],
                us(&cpu["broadcast_one_at_a_time"]["cpu_us_per_delivery"]),
                us(&cpu["ideal_one_at_a_time_cpu_us_per_delivery"])
            );
        } else {
            let _ = writeln!(
                o,
                "| broadcast delivery, one broadcast in flight at a time ({}), the server alone | {} | – |",
                cpu["broadcast_one_at_a_time"]["broadcasts"],
                us(&cpu["broadcast_one_at_a_time"]["cpu_us_per_delivery"]),
            );
            let _ = writeln!(
                o,
                "| the same, alternating with the ideal server in blocks of five (both running, each block after one warm-up broadcast) | {} | {} |",
                us(&alt["cpu_us_per_delivery"]),
                us(&alt["ideal_cpu_us_per_delivery"])
            );
        }
        let alternated = !cpu["broadcast_condition_baseline"].is_null();
        let one = &cpu["broadcast_condition_one_at_a_time"]["cpu_us_per_delivery"];
        if alternated {
            let _ = writeln!(
                o,
                "| broadcast delivery without a condition, {} broadcasts back to back in blocks of {} alternating with the two conditions below; then {} one at a time, alternating the same way | {} back to back; {} one at a time | – |",
                cpu["broadcast_condition_baseline"]["broadcasts"],
                cpu["broadcast_condition_baseline"]["block"],
                cpu["broadcast_condition_one_at_a_time"]["broadcasts"],
                us(&cpu["broadcast_condition_baseline"]["cpu_us_per_delivery"]),
                us(&one["none"])
            );
        }
        for (key, one_key) in [
            ("broadcast_condition", "condition"),
            ("broadcast_condition_js", "condition_js"),
        ] {
            if cpu[key].is_null() {
                continue;
            }
            // A `|` would end the table's cell.
            let cond = cpu[key]["condition"]
                .as_str()
                .unwrap_or_default()
                .replace('|', "\\|");
            if alternated {
                let _ = writeln!(
                    o,
                    "| broadcast delivery with the condition `{cond}`, back to back in those blocks; then one at a time | {} back to back; {} one at a time | – |",
                    us(&cpu[key]["cpu_us_per_delivery"]),
                    us(&one[one_key])
                );
            } else {
                let _ = writeln!(
                    o,
                    "| broadcast delivery with the condition `{cond}`, {} broadcasts back to back | {} | – |",
                    cpu[key]["broadcasts"],
                    us(&cpu[key]["cpu_us_per_delivery"])
                );
            }
        }
        let _ = writeln!(
            o,
            "| broadcast delivery under the shipped limit ({}/s; {:.0} delivered/s) | {} | – |",
            cpu["broadcast_rate_limited"]["rate_limit"],
            f(&cpu["broadcast_rate_limited"]["per_s"]),
            us(&cpu["broadcast_rate_limited"]["cpu_us_per_delivery"])
        );
        let same = &cpu["broadcast_rate_limited"]["one_at_a_time_same_process"];
        if same.is_object() {
            let _ = writeln!(
                o,
                "| one broadcast at a time on that server, before and after its limited ones ({} broadcasts; the limiter made them wait {} times) | {} | – |",
                same["broadcasts"],
                f(&same["limiter_waits"]) as u64,
                us(&same["cpu_us_per_delivery"])
            );
        }
        let _ = writeln!(
            o,
            "\nRSS: {} KB with every connection idle and bound; {} KB ({:.2}×) after {} broadcast deliveries.",
            cpu["idle_rss_kb"],
            cpu["rss_after"]["rss_kb"],
            f(&cpu["rss_after"]["x_idle"]),
            cpu["rss_after"]["deliveries"]
        );
        let lat = &cpu["single_paced"]["latency"];
        if !lat.is_null() {
            let _ = writeln!(
                o,
                "\nSingle-user pushes at {}/s, API call to client receipt, every connection idle and bound: {}.",
                cpu["single_paced"]["rate"],
                quantiles_ms(lat)
            );
            let il = &cpu["single_paced"]["ideal_latency"];
            if !il.is_null() {
                let _ = writeln!(
                    o,
                    "\nThe same through the ideal server, measured once it holds as many connections, after the fast connects (a command line with the stamp where the server reads an HTTP request; one write to the next connection): {}.",
                    quantiles_ms(il)
                );
            }
        }
    }
    let steps: Vec<&Value> = r["curve"].as_array().into_iter().flatten().collect();
    if !steps.is_empty() {
        let _ = writeln!(
            o,
            "\n## The cost curve (node processes on one Redis, TCP v2)\n\n\
             Each step starts fresh node processes and a fresh Redis. RSS per connection is each node's RSS growth over \
             its own connections (the mean over the nodes); Redis memory is `used_memory` growth per connection (its \
             route and its session). A broadcast is sent one at a time through node A's API; its CPU is every node's. \
             The unicast latency is of single-user pushes at 1,000/s through node A's API, most of them crossing to \
             another node.\n\n\
             | connections | nodes | RSS per connection (per node) | Redis per connection | one broadcast to all (median) | server CPU per delivery | unicast at 1,000/s p50 / p99 |\n|---|---|---|---|---|---|---|"
        );
        for st in &steps {
            let per_node: Vec<String> = st["rss_bytes_per_conn"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| format!("{:.0}", f(v)))
                .collect();
            let _ = writeln!(
                o,
                "| {} | {} | {:.0} B ({}) | {:.0} B | {:.1} ms | {:.2} µs | {:.2} / {:.2} ms |",
                st["conns"],
                st["nodes"],
                f(&st["rss_bytes_per_conn_mean"]),
                per_node.join(", "),
                f(&st["redis_bytes_per_conn"]),
                f(&st["broadcast_seconds_median"]) * 1000.0,
                f(&st["broadcast_cpu_us_per_delivery"]),
                f(&st["unicast_1000_per_s"]["p50_us"]) / 1000.0,
                f(&st["unicast_1000_per_s"]["p99_us"]) / 1000.0,
            );
        }
        let _ = writeln!(o, "\n![cost curve](docs/bench/curve.svg)");
    }
    let st = &r["storm"];
    if !st.is_null() {
        let _ = writeln!(
            o,
            "\n## Reconnect storms ({} clients, TCP v2)\n\n\
             Every client is bound to one node; the node is then killed (SIGKILL) and restarted at once on its ports, \
             or drained (SIGTERM) in a two-node cluster on Redis, which redirects its clients to the other node. The clients \
             come back as the SDK does: after a loss, its backoff (1 s doubling to 60 s, ±20 % jitter); after a redirect, \
             the redirect's delay and jitter; with their resume ticket. No client gives up. Connect latency is from an \
             attempt's start to its bind; the server CPU is the process that takes the clients.\n\n\
             | storm | seconds until every client is bound again | server CPU | full / fast handshakes | connect latency p50 / p99 / max | connections lost and attempts failed |\n|---|---|---|---|---|---|",
            st["conns"]
        );
        for (key, what) in [
            ("kill_embedded", "killed and restarted, embedded store"),
            ("kill_redis", "killed and restarted, on Redis"),
            ("drain_redis", "drained, redirected to the other node"),
        ] {
            let v = &st[key];
            if v.is_null() {
                continue;
            }
            let l = &v["connect_latency"];
            let _ = writeln!(
                o,
                "| {what} | {:.1} s | {:.2} s | {} | {:.2} / {:.2} / {:.2} s | {} |",
                f(&v["seconds_to_all_bound"]),
                f(&v["server_cpu_s"]),
                if v["full_handshakes"].is_null() {
                    "–".to_string()
                } else {
                    format!(
                        "{} / {}",
                        f(&v["full_handshakes"]) as u64,
                        f(&v["fast_connects"]) as u64
                    )
                },
                f(&l["p50_us"]) / 1e6,
                f(&l["p99_us"]) / 1e6,
                f(&l["max_us"]) / 1e6,
                v["lost"]
            );
        }
    }
    let _ = writeln!(
        o,
        "\n![latency](docs/bench/latency.svg)\n\n![broadcast](docs/bench/broadcast.svg)\n"
    );
    let analysis = md
        .parent()
        .unwrap_or(Path::new("."))
        .join("docs")
        .join("bench")
        .join("analysis.md");
    if let Ok(a) = std::fs::read_to_string(&analysis) {
        let _ = writeln!(o, "{a}");
    }
    let _ = writeln!(o, "Raw figures: `docs/bench/results.json`.");
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(r)?)?;
    std::fs::write(md, o)?;
    Ok(())
}

/// The ideal's TLS accept beside one transport's connects (measured
/// alternately with them), or the run's one figure (older runs).
fn tls_ideal<'a>(tls: &'a Value, key: &str) -> &'a Value {
    match &tls[key]["ideal_accept_cpu_us"] {
        Value::Null => &tls["ideal_accept_cpu_us"],
        v => v,
    }
}
