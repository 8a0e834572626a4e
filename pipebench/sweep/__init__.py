"""The sweep engine every verb that measures runs: a command's overrides expanded into jobs
(`expand`), every job composed and checked before any runs (`preflight`, `build_check`), the sweep
handed to Hydra with pipebench's launcher (`launch`), and the job process's entry (`job_task`,
`one_job`). Empty of imports, so a job process that imports `job_task` imports nothing else here."""
