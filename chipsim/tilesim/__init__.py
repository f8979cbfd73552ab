"""The cycle-level compute tile model (`compute.timing: cycle-level`): an operation's tile loop on the arrays with
requests in flight, double-buffered SRAM tiles, lanes and SRAM width (tile_sim), and its per-shape results cached by
content hash (op_cache). chipsim.hw.compute_formula is the closed-form model beside it."""
