"""The model summary's data and text table (table.py) and its rich rendering (rich_table.py)."""
