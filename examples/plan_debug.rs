use datahelix::plan::{
    plan,
    synthetic::{synthetic, Kind},
};
fn main() {
    let input = synthetic(Kind::HeavyTail, 1024, 64, 1, 1);
    let p = plan(&input).unwrap();
    for b in p.batches.iter().filter(|b| b.ready_s > b.deadline_s + 0.001) {
        let r = b.rank;
        let idx: Vec<usize> = (0..input.samples.len()).filter(|&i| p.owner[i] == r).collect();
        let sum: f64 = idx.iter().map(|&i| input.samples[i].decode_s).sum();
        let mx = idx.iter().map(|&i| input.samples[i].decode_s).fold(0.0, f64::max);
        println!(
            "rank {r} deadline {:.4} ready {:.4} decode sum/4 {:.4} max job {:.4}",
            b.deadline_s,
            b.ready_s,
            sum / 4.0,
            mx
        );
    }
}
