package pgoutputspark.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system for file: paths, without starting a process per file.
 *
 * Without Hadoop's native library, RawLocalFileSystem starts chmod to set each new
 * file's and directory's permissions, and readlink on both sides of a rename (on the
 * path's text, "file:/...", which never names a link). Here both go through java.nio;
 * modes with set-uid, set-gid or sticky bits, file systems without POSIX modes and real
 * symbolic links stay Hadoop's. Sessions see it through NioLocalFileSystem (file:) and
 * NioLocalFs (FileContext).
 * Compiled at a local session's start by pgoutput_spark.spark.localfs.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
    private static final PosixFilePermission[] MODE_BITS = {
        PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE,
        PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE,
        PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE,
    };

    public void setPermission(Path p, FsPermission permission) throws IOException {
        int mode = permission.toShort();
        if ((mode & 07000) != 0) {
            super.setPermission(p, permission);
            return;
        }
        EnumSet permissions = EnumSet.noneOf(PosixFilePermission.class);
        for (int i = 0; i < MODE_BITS.length; i++) {
            if ((mode & (0400 >> i)) != 0) {
                permissions.add(MODE_BITS[i]);
            }
        }
        try {
            Files.setPosixFilePermissions(pathToFile(p).toPath(), permissions);
        } catch (UnsupportedOperationException notPosix) {  // a file system without POSIX modes
            super.setPermission(p, permission);
        }
    }

    public FileStatus getFileLinkStatus(Path f) throws IOException {
        if (Files.isSymbolicLink(pathToFile(f).toPath())) {
            return super.getFileLinkStatus(f);
        }
        return getFileStatus(f);
    }
}
