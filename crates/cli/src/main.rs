fn main() {
    println!("scalevfs: no workloads yet");
}
