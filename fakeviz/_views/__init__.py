"""Layer 4, views: pure functions of a record (through ``fakeviz._analysis``) to plotly figures, the explorer
widget and its payload, the HTML report and text summaries.
"""
