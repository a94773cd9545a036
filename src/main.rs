fn main() {
    println!("quire: under construction");
}
