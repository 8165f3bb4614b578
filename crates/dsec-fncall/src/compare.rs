//! Output comparison of judge mode.

use dsec_api::CompareMode;

pub fn outputs_match(mode: CompareMode, tolerance: f64, actual: &[u8], expected: &[u8]) -> bool {
    match mode {
        CompareMode::Exact => actual == expected,
        CompareMode::Whitespace => tokens(actual).eq(tokens(expected)),
        CompareMode::Float => {
            let (mut a, mut e) = (tokens(actual), tokens(expected));
            loop {
                match (a.next(), e.next()) {
                    (None, None) => return true,
                    (Some(x), Some(y)) if x == y => {}
                    (Some(x), Some(y)) => {
                        let parse = |t: &[u8]| std::str::from_utf8(t).ok().and_then(|s| s.parse::<f64>().ok());
                        match (parse(x), parse(y)) {
                            (Some(p), Some(q)) if close(p, q, tolerance) => {}
                            _ => return false,
                        }
                    }
                    _ => return false,
                }
            }
        }
    }
}

fn tokens(b: &[u8]) -> impl Iterator<Item = &[u8]> {
    b.split(|c| c.is_ascii_whitespace()).filter(|t| !t.is_empty())
}

/// Equal within `tol` absolutely or relatively, whichever is looser.
fn close(a: f64, b: f64, tol: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    let diff = (a - b).abs();
    diff <= tol || diff <= tol * b.abs().max(a.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_whitespace_and_float() {
        assert!(outputs_match(CompareMode::Exact, 0.0, b"1 2\n", b"1 2\n"));
        assert!(!outputs_match(CompareMode::Exact, 0.0, b"1 2", b"1 2\n"));
        assert!(outputs_match(CompareMode::Whitespace, 0.0, b"1  2\r\n\n", b"1 2\n"));
        assert!(!outputs_match(CompareMode::Whitespace, 0.0, b"1 2 3", b"1 2"));
        assert!(!outputs_match(CompareMode::Whitespace, 0.0, b"12", b"1 2"));
        assert!(outputs_match(CompareMode::Float, 1e-6, b"0.3333333 x", b"0.333333333 x"));
        assert!(outputs_match(CompareMode::Float, 1e-6, b"1000000.5", b"1000000.0"), "relative tolerance");
        assert!(!outputs_match(CompareMode::Float, 1e-6, b"0.34", b"0.33"));
        assert!(!outputs_match(CompareMode::Float, 1e-6, b"abc", b"abd"));
        assert!(!outputs_match(CompareMode::Float, 1e-6, b"1", b"1 2"));
    }
}
