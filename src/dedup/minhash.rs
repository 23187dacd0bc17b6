//! MinHash signatures of token shingles and their band keys: the one
//! definition of what makes two documents candidates.
//!
//! A document's shingles are its windows of `n` consecutive token ids (a
//! document shorter than `n` tokens is one shingle of all of them; an
//! empty one has none). Each shingle is hashed once, `x = XXH3-64` of its
//! ids as little-endian u32s, and the signature is, for each of the
//! `bands * rows` hash functions `h_i(x) = ((a_i x + b_i) mod 2⁶⁴) mod
//! (2⁶¹ - 1)`, the minimum over the document's shingles: the family
//! datatrove's MinHash uses, with `a_i` in `[1, 2⁶¹ - 1)` and `b_i` in
//! `[0, 2⁶¹ - 1)` drawn from `seed` by SplitMix64. For two documents with
//! shingle sets of Jaccard similarity `s`, each position agrees with
//! probability `s`.
//!
//! The signature is cut into `bands` bands of `rows` values; band `j`'s key
//! is XXH3-64 of its values (little-endian u64s) with seed `j`. Two
//! documents are candidates when some band's keys are equal, which happens
//! with probability `1 - (1 - s^rows)^bands` ([`candidate_probability`]).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The Mersenne prime `2⁶¹ - 1` the hash functions reduce modulo.
const PRIME: u64 = (1 << 61) - 1;

/// The shape of the signatures: shingle length, bands, rows per band and
/// the seed of the hash functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// Tokens per shingle.
    pub ngram: usize,
    /// Bands of the signature.
    pub bands: usize,
    /// Hash values per band.
    pub rows: usize,
    /// Seed of the hash functions' coefficients.
    pub seed: u64,
}

impl Default for Params {
    /// datatrove's defaults: 5-grams, 14 bands of 8 rows, seed 1.
    fn default() -> Params {
        Params {
            ngram: 5,
            bands: 14,
            rows: 8,
            seed: 1,
        }
    }
}

impl std::fmt::Display for Params {
    /// As the command line gives them: `--ngram 5 --bands 14 --rows 8 --seed 1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--ngram {} --bands {} --rows {} --seed {}",
            self.ngram, self.bands, self.rows, self.seed
        )
    }
}

impl Params {
    /// The similarity where a pair is a candidate with probability about
    /// one half: `(1 / bands)^(1 / rows)`.
    pub fn threshold(&self) -> f64 {
        (1.0 / self.bands as f64).powf(1.0 / self.rows as f64)
    }
}

/// The probability that two documents whose shingle sets have Jaccard
/// similarity `s` share a band: `1 - (1 - s^rows)^bands`.
pub fn candidate_probability(s: f64, params: &Params) -> f64 {
    1.0 - (1.0 - s.powi(params.rows as i32)).powi(params.bands as i32)
}

/// The hash functions of one [`Params`], ready to sign documents.
#[derive(Debug, Clone)]
pub struct MinHasher {
    params: Params,
    a: Vec<u64>,
    b: Vec<u64>,
}

/// SplitMix64: the coefficients' generator.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform draw from `[lo, PRIME)` by rejection.
fn below_prime(state: &mut u64, lo: u64) -> u64 {
    loop {
        let x = splitmix(state) >> 3; // 61 bits
        if (lo..PRIME).contains(&x) {
            return x;
        }
    }
}

impl MinHasher {
    /// The hash functions of `params`.
    pub fn new(params: Params) -> MinHasher {
        let k = params.bands * params.rows;
        let mut state = params.seed;
        let mut a = Vec::with_capacity(k);
        let mut b = Vec::with_capacity(k);
        for _ in 0..k {
            a.push(below_prime(&mut state, 1));
            b.push(below_prime(&mut state, 0));
        }
        MinHasher { params, a, b }
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Hash values in a signature: `bands * rows`.
    pub fn len(&self) -> usize {
        self.a.len()
    }

    /// True for a signature of no values (never: bands and rows are at least 1).
    pub fn is_empty(&self) -> bool {
        self.a.is_empty()
    }

    /// The signature of a document whose ids are `ids` into `out` (cleared
    /// first): `false`, and `out` all `u64::MAX`, for an empty document.
    /// `scratch` holds the shingle hashes between calls.
    pub fn sign(&self, ids: &[u32], scratch: &mut Vec<u64>, out: &mut Vec<u64>) -> bool {
        out.clear();
        out.resize(self.len(), u64::MAX);
        scratch.clear();
        if ids.is_empty() {
            return false;
        }
        let n = self.params.ngram.min(ids.len());
        // The ids as little-endian bytes, each window a slice of them.
        let bytes = le_bytes(ids);
        scratch.extend((0..=ids.len() - n).map(|i| xxh3_64(&bytes[4 * i..4 * (i + n)])));
        // A repeated shingle changes no minimum: the shingles are a set
        // without being made one.
        minima(&self.a, &self.b, scratch, out);
        true
    }

    /// Band `j`'s key of `signature`.
    pub fn band_key(&self, signature: &[u64], j: usize) -> u64 {
        let rows = self.params.rows;
        let mut bytes = Vec::with_capacity(8 * rows);
        for v in &signature[j * rows..(j + 1) * rows] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        xxh3_64_with_seed(&bytes, j as u64)
    }
}

/// `ids` as little-endian bytes: the ids' own memory on a little-endian
/// machine, a copy elsewhere.
fn le_bytes(ids: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: a u32 slice is `4 * len` initialised bytes, and u8 has no
        // alignment; on a little-endian machine they are the ids' LE bytes.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(ids.as_ptr().cast::<u8>(), std::mem::size_of_val(ids))
        })
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(ids.iter().flat_map(|t| t.to_le_bytes()).collect())
    }
}

/// `out[i] = min over x of h_i(x)`, the signature's values, on the widest
/// vectors the CPU has: the same numbers on any CPU.
fn minima(a: &[u64], b: &[u64], xs: &[u64], out: &mut [u64]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512dq") {
        // SAFETY: the CPU has AVX-512 F and DQ, checked just above.
        unsafe { minima_avx512(a, b, xs, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { minima_avx2(a, b, xs, out) };
        return;
    }
    minima_portable(a, b, xs, out);
}

/// [`minima`] compiled for AVX-512 (eight values per instruction, with a
/// 64-bit multiply of its own).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn minima_avx512(a: &[u64], b: &[u64], xs: &[u64], out: &mut [u64]) {
    minima_portable(a, b, xs, out);
}

/// [`minima`] compiled for AVX2 (four values per instruction).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn minima_avx2(a: &[u64], b: &[u64], xs: &[u64], out: &mut [u64]) {
    minima_portable(a, b, xs, out);
}

/// [`minima`] as plain code: each value a reduction over the shingles,
/// which the compiler turns into vector code.
#[inline(always)]
fn minima_portable(a: &[u64], b: &[u64], xs: &[u64], out: &mut [u64]) {
    for ((m, &a), &b) in out.iter_mut().zip(a).zip(b) {
        let mut min = u64::MAX;
        for &x in xs {
            let y = a.wrapping_mul(x).wrapping_add(b);
            let v = (y & PRIME) + (y >> 61);
            // `v` is below 2 PRIME: one subtraction reduces it.
            let v = if v >= PRIME { v - PRIME } else { v };
            min = min.min(v);
        }
        *m = min;
    }
}

/// The Jaccard similarity of two documents' shingle sets, computed
/// exactly: what a signature estimates (for tests and audits).
pub fn jaccard(a: &[u32], b: &[u32], ngram: usize) -> f64 {
    use std::collections::HashSet;
    let set = |ids: &[u32]| -> HashSet<Vec<u32>> {
        if ids.is_empty() {
            return HashSet::new();
        }
        ids.windows(ngram.min(ids.len()))
            .map(<[u32]>::to_vec)
            .collect()
    };
    let (x, y) = (set(a), set(b));
    let union = x.union(&y).count();
    if union == 0 {
        return 0.0;
    }
    x.intersection(&y).count() as f64 / union as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(seed: u64, n: usize) -> Vec<u32> {
        let mut s = seed;
        (0..n).map(|_| (splitmix(&mut s) % 50_000) as u32).collect()
    }

    #[test]
    fn the_share_of_equal_values_estimates_the_jaccard_similarity() {
        let h = MinHasher::new(Params {
            bands: 64,
            rows: 8,
            ..Params::default()
        });
        let (mut scratch, mut x, mut y) = (Vec::new(), Vec::new(), Vec::new());
        for (seed, edits) in [(1u64, 0usize), (2, 5), (3, 30), (4, 100), (5, 400)] {
            let a = words(seed, 800);
            let mut b = a.clone();
            let mut s = seed ^ 0xABCD;
            for _ in 0..edits {
                let at = (splitmix(&mut s) % b.len() as u64) as usize;
                b[at] = (splitmix(&mut s) % 50_000) as u32;
            }
            let truth = jaccard(&a, &b, 5);
            h.sign(&a, &mut scratch, &mut x);
            h.sign(&b, &mut scratch, &mut y);
            let k = x.len() as f64;
            let estimate = x.iter().zip(&y).filter(|(p, q)| p == q).count() as f64 / k;
            // Four standard deviations of a binomial share of k draws.
            let sd = (truth * (1.0 - truth) / k).sqrt().max(1.0 / k);
            assert!(
                (estimate - truth).abs() <= 4.0 * sd,
                "{edits} edits: estimate {estimate}, Jaccard {truth}"
            );
        }
    }

    #[test]
    fn a_signature_depends_on_the_shingle_set_and_the_seed_only() {
        let h = MinHasher::new(Params::default());
        let (mut scratch, mut x, mut y) = (Vec::new(), Vec::new(), Vec::new());
        // The same set of 3-grams in another order and multiplicity.
        let h3 = MinHasher::new(Params {
            ngram: 3,
            ..Params::default()
        });
        h3.sign(&[1, 2, 3, 4, 1, 2, 3], &mut scratch, &mut x);
        h3.sign(&[4, 1, 2, 3, 4, 1, 2, 3, 4], &mut scratch, &mut y);
        assert_eq!(x, y);
        // Short documents are one shingle; empty ones sign nothing.
        assert!(h.sign(&[7, 8], &mut scratch, &mut x));
        assert!(h.sign(&[7, 8], &mut scratch, &mut y));
        assert_eq!(x, y);
        h.sign(&[7, 9], &mut scratch, &mut y);
        assert_ne!(x, y);
        assert!(!h.sign(&[], &mut scratch, &mut y));
        let other = MinHasher::new(Params {
            seed: 2,
            ..Params::default()
        });
        other.sign(&[7, 8], &mut scratch, &mut y);
        assert_ne!(x, y);
        assert!(x.iter().all(|&v| v < PRIME));
    }

    #[test]
    fn every_code_path_computes_the_same_minima() {
        let mut s = 3u64;
        let h = MinHasher::new(Params::default());
        for n in [1usize, 3, 4, 7, 8, 9, 64, 1001] {
            let xs: Vec<u64> = (0..n).map(|_| splitmix(&mut s)).collect();
            let mut plain = vec![0; h.len()];
            minima_portable(&h.a, &h.b, &xs, &mut plain);
            let mut dispatched = vec![0; h.len()];
            minima(&h.a, &h.b, &xs, &mut dispatched);
            assert_eq!(plain, dispatched, "{n} shingles");
            // The reference: the same family in 128-bit arithmetic.
            for (i, m) in plain.iter().enumerate() {
                let want = xs
                    .iter()
                    .map(|&x| {
                        let y = (u128::from(h.a[i]) * u128::from(x) + u128::from(h.b[i])) as u64;
                        y % PRIME
                    })
                    .min()
                    .unwrap();
                assert_eq!(*m, want);
            }
        }
    }

    #[test]
    fn the_threshold_is_where_the_formula_gives_about_one_half() {
        let p = Params::default();
        let t = p.threshold();
        assert!((0.71..0.73).contains(&t), "{t}");
        let at = candidate_probability(t, &p);
        assert!((0.5..0.7).contains(&at), "{at}");
        assert!(candidate_probability(0.9, &p) > 0.99);
        assert!(candidate_probability(0.3, &p) < 0.001);
    }
}
