package pgoutputspark.fs;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * NioRawLocalFileSystem for FileContext (fs.AbstractFileSystem.file.impl), as Hadoop's
 * RawLocalFs is RawLocalFileSystem's: Delta writes its checksum files through a
 * FileContext, and its renames look at both sides.
 */
public class NioLocalFs extends DelegateToFileSystem {
    public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
        super(uri, new NioRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    public int getUriDefaultPort() {
        return -1;
    }

    public FsServerDefaults getServerDefaults(Path f) throws IOException {
        return LocalConfigKeys.getServerDefaults();
    }

    public FsServerDefaults getServerDefaults() throws IOException {
        return LocalConfigKeys.getServerDefaults();
    }

    public boolean isValidName(String src) {
        return true;
    }
}
