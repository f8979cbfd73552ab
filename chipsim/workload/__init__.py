"""What runs on the machine: published model shapes (models), the decode step as costed operations (decode), an
expert on the host CPU (host), the operation keys a config may name (op_keys), every operation both ways (op_table:
`chipsim calibrate`)."""
