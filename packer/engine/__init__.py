"""Running a pack: the engines (local pool, Ray), parts and where they are cut, the job."""
