mod size;

fn main(){}
