"""Whether a decided plan can be built on this execution point, answered before anything is built.

Pure: no kernel, no files. PREPARE_JOB's check and setup call the same function, so a job that setup would
refuse for a reason knowable in advance is held at PREPARE_JOB with that reason instead of failing mid-build.
"""
