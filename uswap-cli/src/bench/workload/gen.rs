//! Which page each access goes to: sequential, uniform, zipf or normal, as pmbench offers
//! them, driven by a small xorshift generator (the one `probes/memtouch.c` uses, so the
//! uniform stream of the memtouch workload is the probe's).

use super::options::Pattern;

/// xorshift64: fast, and good enough to pick pages.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed })
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let x = &mut self.0;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Uniform in `0..n` (`n` > 0); the modulo bias is negligible for page counts.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in (0, 1].
    #[inline]
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// Draws ranks `1..=n` with probability proportional to `rank^-s`, in O(1) per draw:
/// rejection-inversion (Hörmann and Derflinger, 1996), as in Apache Commons' sampler.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    threshold: f64,
}

impl Zipf {
    pub fn new(n: u64, s: f64) -> Zipf {
        let n = n.max(1) as f64;
        let mut z = Zipf { n, s, h_x1: 0.0, h_n: 0.0, threshold: 0.0 };
        z.h_x1 = z.h_integral(1.5) - 1.0;
        z.h_n = z.h_integral(n + 0.5);
        z.threshold = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let lx = x.ln();
        helper2((1.0 - self.s) * lx) * lx
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }

    /// A rank in `1..=n`.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_n + rng.unit() * (self.h_x1 - self.h_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }
}

/// ln(1 + x) / x, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// (e^x - 1) / x, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// Pages `lo..hi` visited in a pattern.
#[derive(Debug, Clone)]
pub enum PageGen {
    /// In order from `next`, wrapping at `hi`.
    Seq {
        lo: u64,
        hi: u64,
        next: u64,
    },
    Uniform {
        lo: u64,
        n: u64,
    },
    /// Rank 1 (the hottest page) is `lo`, rank 2 the next page, and so on.
    Zipf {
        lo: u64,
        zipf: Zipf,
    },
    /// Centred on the middle of the range, standard deviation `sd` pages, wrapped into it.
    Normal {
        lo: u64,
        n: u64,
        sd: f64,
    },
}

impl PageGen {
    /// `start` is where a sequential walk begins (inside `lo..hi`); `skew` the zipf
    /// exponent; `sd_frac` the normal standard deviation as a fraction of the range.
    pub fn new(pattern: Pattern, lo: u64, hi: u64, start: u64, skew: f64, sd_frac: f64) -> PageGen {
        let n = (hi - lo).max(1);
        match pattern {
            Pattern::Seq => PageGen::Seq { lo, hi: lo + n, next: start.clamp(lo, lo + n - 1) },
            Pattern::Random => PageGen::Uniform { lo, n },
            Pattern::Zipf => PageGen::Zipf { lo, zipf: Zipf::new(n, skew) },
            Pattern::Normal => PageGen::Normal { lo, n, sd: (sd_frac * n as f64).max(1e-9) },
        }
    }

    #[inline]
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        match self {
            PageGen::Seq { lo, hi, next } => {
                let i = *next;
                *next = if i + 1 >= *hi { *lo } else { i + 1 };
                i
            }
            PageGen::Uniform { lo, n } => *lo + rng.below(*n),
            PageGen::Zipf { lo, zipf } => *lo + zipf.sample(rng) - 1,
            PageGen::Normal { lo, n, sd } => {
                // Box-Muller; one of the pair is enough here.
                let z = (-2.0 * rng.unit().ln()).sqrt() * (std::f64::consts::TAU * rng.unit()).cos();
                let off = (*n as f64 / 2.0 + z * *sd).floor() as i64;
                *lo + off.rem_euclid(*n as i64) as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(mut g: PageGen, n: u64, draws: u64) -> Vec<u64> {
        let mut rng = Rng::new(7);
        let mut c = vec![0u64; n as usize];
        for _ in 0..draws {
            let i = g.next(&mut rng);
            assert!((10..10 + n).contains(&i), "{i} outside the range");
            c[(i - 10) as usize] += 1;
        }
        c
    }

    #[test]
    fn sequential_walk_wraps_inside_its_range() {
        let mut g = PageGen::new(Pattern::Seq, 10, 14, 12, 0.0, 0.0);
        let mut rng = Rng::new(1);
        let got: Vec<u64> = (0..6).map(|_| g.next(&mut rng)).collect();
        assert_eq!(got, [12, 13, 10, 11, 12, 13]);
    }

    #[test]
    fn zipf_frequencies_follow_the_power_law() {
        let n = 1000;
        let draws = 400_000;
        let c = counts(PageGen::new(Pattern::Zipf, 10, 10 + n, 10, 1.0, 0.0), n, draws);
        // P(rank k) = k^-1 / H_n, H_1000 = 7.4855.
        let h = 7.485_470_860_550_345;
        for k in [1usize, 2, 10] {
            let want = draws as f64 / (k as f64 * h);
            let got = c[k - 1] as f64;
            assert!((got - want).abs() / want < 0.05, "rank {k}: {got} draws, expected {want}");
        }
        assert!(c[0] > c[1] && c[1] > c[9] && c[9] > c[999]);
        // Skew 0 is uniform.
        let u = counts(PageGen::new(Pattern::Zipf, 10, 10 + n, 10, 0.0, 0.0), n, draws);
        let (min, max) = (u.iter().min().unwrap(), u.iter().max().unwrap());
        assert!(*min > 300 && *max < 520, "min {min} max {max}");
    }

    #[test]
    fn normal_concentrates_around_the_middle() {
        let n = 1000;
        let draws = 200_000;
        let c = counts(PageGen::new(Pattern::Normal, 10, 10 + n, 10, 0.0, 0.1), n, draws);
        // Within one standard deviation (100 pages) of the middle: 68.3 %.
        let inside: u64 = c[400..600].iter().sum();
        let frac = inside as f64 / draws as f64;
        assert!((frac - 0.683).abs() < 0.01, "{frac}");
    }

    #[test]
    fn uniform_is_the_memtouch_stream() {
        // memtouch.c: x ^= x<<13; x ^= x>>7; x ^= x<<17 from 88172645463325252.
        let mut rng = Rng::new(88172645463325252);
        let mut g = PageGen::new(Pattern::Random, 0, 1 << 18, 0, 0.0, 0.0);
        let mut x: u64 = 88172645463325252;
        for _ in 0..100 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(g.next(&mut rng), x % (1 << 18));
        }
    }
}
