//! Checks of the JSON reports `spore bench` prints.

use serde_json::Value;

/// `v` as a finite number above zero (and that number), or a failure naming `what`.
#[track_caller]
pub fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is missing or not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

/// The value at a dotted `path` (`a.b.0.c`: keys, and indexes of arrays).
pub fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => &v[k],
    })
}
