"""`lark report`: network accounting from the job history HTCondor keeps (the Network* and Lark* attributes the
job hooks write), cached incrementally in SQLite keyed by GlobalJobId, grouped and printed or charted."""
