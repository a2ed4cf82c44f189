"""What lives on the share and how it is written: its layout and names, atomic writes, and the
checkpoint store with its fencing."""
