//! Small dense least-squares solves the cost models share: Gaussian elimination of an `N × N`
//! system, and non-negative least squares from normal equations (every coefficient of a cost is a
//! cost, so none may be negative).
//!
//! ```
//! use datahelix::cost::lsq;
//!
//! // Normal equations of y = 2·x fitted with an intercept and a slope, from (1, 2) and (2, 4).
//! let ata = [[2.0, 3.0], [3.0, 5.0]];
//! let atb = [6.0, 10.0];
//! let c = lsq::nonnegative(&ata, &atb).unwrap();
//! assert!(c[0].abs() < 1e-12 && (c[1] - 2.0).abs() < 1e-12);
//! ```
//!
//! Deterministic: the same system gives bit-identical coefficients on every rank.

/// Solves `a·x = b` by Gaussian elimination with partial pivoting; `None` when singular or not
/// finite.
pub fn solve<const N: usize>(mut a: [[f64; N]; N], mut b: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let piv = (col..N).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        // Eliminate the column below the pivot (the rows beneath it, and their right-hand sides).
        let (above, below) = a.split_at_mut(col + 1);
        let (pivot_row, pivot_b) = (&above[col], b[col]);
        for (row, b_r) in below.iter_mut().zip(&mut b[col + 1..]) {
            let m = row[col] / pivot_row[col];
            for (x, &p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= m * p;
            }
            *b_r -= m * pivot_b;
        }
    }
    let mut x = [0.0; N];
    for r in (0..N).rev() {
        let s: f64 = (r + 1..N).map(|c| a[r][c] * x[c]).sum();
        x[r] = (b[r] - s) / a[r][r];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// The least-squares coefficients, all ≥ 0, of the normal equations `ata·c = atb`. When the
/// unconstrained solve has a negative one — too little spread in the data to tell the terms
/// apart, e.g. features that grow together — clamping it would leave the others fitted to a model
/// that no longer exists (predicting steps twice as long as they are, or decodes ten times too
/// short); instead every subset of terms is solved with the rest at 0 and the best non-negative
/// fit kept: exact non-negative least squares, `2^N` small solves (N ≤ 4 here).
pub fn nonnegative<const N: usize>(ata: &[[f64; N]; N], atb: &[f64; N]) -> Option<[f64; N]> {
    if let Some(c) = solve(*ata, *atb) {
        if c.iter().all(|&x| x >= 0.0) {
            return Some(c);
        }
    }
    // The residual up to the constant Σ y²: cᵀ·ata·c − 2·cᵀ·atb.
    let residual = |c: &[f64; N]| {
        let mut r = 0.0;
        for i in 0..N {
            r -= 2.0 * c[i] * atb[i];
            for j in 0..N {
                r += c[i] * ata[i][j] * c[j];
            }
        }
        r
    };
    let mut best: Option<([f64; N], f64)> = None;
    for subset in 1u32..(1 << N) - 1 {
        let used = |i: usize| subset & (1 << i) != 0;
        let (mut a, mut b) = ([[0.0f64; N]; N], [0.0f64; N]);
        for i in 0..N {
            if used(i) {
                for j in (0..N).filter(|&j| used(j)) {
                    a[i][j] = ata[i][j];
                }
                b[i] = atb[i];
            } else {
                a[i][i] = 1.0;
            }
        }
        let Some(c) = solve(a, b) else { continue };
        if c.iter().any(|x| *x < 0.0) {
            continue;
        }
        let r = residual(&c);
        if best.is_none_or(|(_, old)| r < old) {
            best = Some((c, r));
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_unconstrained_term_is_dropped_not_clamped() {
        // y = 1 + 0·x observed at x = 1, 2, 3 with noise that pulls the slope negative.
        let (xs, ys) = ([1.0, 2.0, 3.0], [1.2, 1.0, 0.9]);
        let mut ata = [[0.0; 2]; 2];
        let mut atb = [0.0; 2];
        for (x, y) in xs.iter().zip(ys) {
            let row = [1.0, *x];
            for i in 0..2 {
                for j in 0..2 {
                    ata[i][j] += row[i] * row[j];
                }
                atb[i] += row[i] * y;
            }
        }
        assert!(solve(ata, atb).unwrap()[1] < 0.0, "unconstrained: a negative slope");
        let c = nonnegative(&ata, &atb).unwrap();
        assert_eq!(c[1], 0.0);
        assert!((c[0] - 31.0 / 30.0).abs() < 1e-12, "the mean of y: {}", c[0]);
    }

    #[test]
    fn singular_systems_say_none() {
        assert_eq!(solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0]), None);
    }
}
