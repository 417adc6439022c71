fn main() {
    eprintln!("being written");
    std::process::exit(1)
}
